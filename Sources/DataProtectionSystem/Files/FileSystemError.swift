import Foundation
import SystemPackage

/// A file-system call failed: which call, on which path, and the `errno` it returned.
///
/// ```swift
/// catch let error as FileSystemError where error.errno == .noSpace { … }   // disk full
/// ```
public struct FileSystemError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// The call that failed (`open`, `write`, `rename`, `setxattr`, …).
    public let operation: String
    /// The path it failed on.
    public let path: String
    /// The error number.
    public let errno: Errno

    public init(_ operation: String, path: String, errno: Errno) {
        self.operation = operation
        self.path = path
        self.errno = errno
    }

    public var description: String { "\(path): \(operation) failed: \(errno.description)" }
    public var errorDescription: String? { description }
}
