import CLinuxShims
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Extended attributes by path: read in one call where they are short, the `user.` ones of a
/// link its own.
extension POSIXFile {
    /// `getxattr(2)`: the attribute's value, or `nil` when it is not set.
    package static func getAttribute(_ name: String, path: String) throws -> [UInt8]? {
        let value = try LosslessPath.withCString(path) { c in readAttributeBytes { getxattr(c, name, $0, $1) } }
        switch value {
        case .success(let bytes): return bytes
        case .failure(.noData): return nil
        case .failure(let err): throw FileSystemError("getxattr", path: path, errno: err)
        }
    }

    /// The `user.*` extended attributes of `path` (`llistxattr` and `lgetxattr`: a link's own, never
    /// its target's): marks the user or another program set, the do-not-back-up mark among them.
    package static func userAttributes(_ path: String) throws -> [(name: String, value: [UInt8])] {
        try LosslessPath.withCString(path) { c in
            let names: [UInt8]
            switch readAttributeBytes({ llistxattr(c, $0, $1) }) {
            case .success(let bytes): names = bytes
            case .failure(.notSupported), .failure(.noSuchFileOrDirectory): return []
            case .failure(let err): throw FileSystemError("listxattr", path: path, errno: err)
            }
            var result: [(name: String, value: [UInt8])] = []
            for raw in names.split(separator: 0) {
                let name = String(decoding: raw, as: UTF8.self)
                guard name.hasPrefix("user.") else { continue }
                // Removed meanwhile: not there.
                if case .success(let value) = readAttributeBytes({ lgetxattr(c, name, $0, $1) }) {
                    result.append((name, value))
                }
            }
            return result
        }
    }

    /// What an `*xattr` read (`read(buffer, size)`) returns: one call into a small buffer (the
    /// values and lists kept here are short), asking for the size and again only when it is
    /// larger (`ERANGE`, also when it grew in between).
    static func readAttributeBytes(_ read: (UnsafeMutableRawPointer?, Int) -> Int) -> Result<[UInt8], Errno> {
        var capacity = 256
        while true {
            var bytes = [UInt8](repeating: 0, count: capacity)
            let n = bytes.withUnsafeMutableBytes { read($0.baseAddress, capacity) }
            if n >= 0 { bytes.removeSubrange(n...); return .success(bytes) }
            let err = Errno(rawValue: Glibc.errno)
            switch err {
            case .interrupted: continue
            case .outOfRange:
                let size = read(nil, 0)
                guard size >= 0 else { return .failure(Errno(rawValue: Glibc.errno)) }
                capacity = max(size, capacity * 2)
            default: return .failure(err)
            }
        }
    }

    /// `setxattr(2)`.
    package static func setAttribute(_ name: String, _ value: [UInt8], path: String) throws {
        try call("setxattr", path) { c in value.withUnsafeBytes { setxattr(c, name, $0.baseAddress, $0.count, 0) } }
    }

    /// `removexattr(2)`; removing an attribute that is not set is not an error.
    package static func removeAttribute(_ name: String, path: String) throws {
        if try LosslessPath.withCString(path, { removexattr($0, name) }) != 0 {
            let err = Errno(rawValue: Glibc.errno)
            if err != .noData { throw FileSystemError("removexattr", path: path, errno: err) }
        }
    }

    /// Whether `path` exists, and whether it is a directory (symbolic links followed).
    package static func kind(_ path: String) -> (exists: Bool, isDirectory: Bool) {
        guard let st = status(path) else { return (false, false) }
        return (true, (st.st_mode & S_IFMT) == S_IFDIR)
    }
}
