@testable import DataProtectionBackup
import Foundation
import Testing

/// Backup IDs are the UTC second they were made and 8 hex digits, always 8 (a random number
/// below 0x10000000 once made a 7-digit ID).
@Suite struct BackupIdentifierTests {
    @Test func everyBackupIDHasEightHexDigits() throws {
        let shape = try Regex("^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$")
        for _ in 0..<2_000 {
            let id = BackupEngine.makeID(at: Date())
            #expect(id.wholeMatch(of: shape) != nil, "\(id)")
        }
    }
}
