import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// What tells one granted item from another that later gets its inode number: its birth time
/// (`statx`'s `stx_btime`, which a reused inode does not keep) and whether it is a directory.
struct ItemIdentity: Equatable {
    /// "seconds.nanoseconds", or `nil` where the file system keeps no birth time.
    var birthTime: String?
    var isDirectory: Bool

    /// The identity of the item open as `descriptor`.
    init(descriptor: FileDescriptor, status: stat) {
        self.init(birthTime: Self.birthTime(descriptor.rawValue, ""), isDirectory: status.st_mode & S_IFMT == S_IFDIR)
    }

    /// The identity of the item at `path` (a link is not followed).
    init?(path: String) {
        guard let st = POSIXFile.linkStatus(path) else { return nil }
        let birth = try? LosslessPath.withCString(path) { Self.birthTime(AT_FDCWD, $0) }
        self.init(birthTime: birth ?? nil, isDirectory: st.st_mode & S_IFMT == S_IFDIR)
    }

    init(birthTime: String?, isDirectory: Bool) {
        (self.birthTime, self.isDirectory) = (birthTime, isDirectory)
    }

    private static func birthTime(_ directory: Int32, _ path: UnsafePointer<CChar>) -> String? {
        guard let time = try? SystemCall.statxBirthTime(directory, path) else { return nil }
        return String(format: "%lld.%09u", Int64(time.tv_sec), UInt32(time.tv_nsec))
    }

    /// Whether the item a grant recorded is this one: the same kind and a recorded birth time
    /// equal to this one's (no birth time on either side: not provable, so not the same).
    func isRecorded(by grant: Grant) -> Bool {
        guard let recorded = grant.birthTime, let birthTime, grant.isDirectory == isDirectory else { return false }
        return recorded == birthTime
    }
}
