import DataProtection
import DataProtectionTestSupport
import Foundation
import Testing

func isUnavailable(_ error: any Error, writing: Bool? = nil) -> Bool {
    guard case ProtectedFileError.unavailable(_, _, _, let w) = error else { return false }
    return writing == nil || writing == w
}

func isDamaged(_ error: any Error) -> Bool {
    guard case ProtectedFileError.damaged = error else { return false }
    return true
}
