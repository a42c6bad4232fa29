import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// What a file system served over FUSE does, one method per operation, in Swift's types: the
/// ``KernelSession`` decodes each request (``FileSystemRequest``), calls the method, and encodes
/// its answer; an `Errno` thrown is the request's answer. (go-fuse's `RawFileSystem`, without
/// the raw structures.) Nodes are the IDs the file system gave the kernel in ``NodeEntry``;
/// handles are those it gave at an open.
///
/// Adding an operation: a case in ``FileSystemRequest`` and its decoding, a method here, its
/// call and answer in ``KernelSession``, and a test that feeds its bytes (CONTRIBUTING.md).
protocol FileSystemOperations: AnyObject, Sendable {
    /// The kernel drops `count` lookups of `node` (each ``NodeEntry`` given counts one).
    func forget(_ node: UInt64, count: UInt64)

    func lookup(_ name: [UInt8], in parent: UInt64) throws(Errno) -> NodeEntry
    func attributes(of node: UInt64) throws(Errno) -> NodeAttributes
    func checkAccess(_ node: UInt64, mask: Int32) throws(Errno)
    func setAttributes(
        _ change: AttributeChange, of node: UInt64, _ request: RequestContext
    ) throws(Errno) -> NodeAttributes
    func readLink(_ node: UInt64) throws(Errno) -> [UInt8]
    func symbolicLink(_ name: [UInt8], in parent: UInt64, to target: [UInt8]) throws(Errno) -> NodeEntry
    func makeNode(_ name: [UInt8], in parent: UInt64, mode: UInt32) throws(Errno) -> NodeEntry
    func makeDirectory(_ name: [UInt8], in parent: UInt64, mode: UInt32) throws(Errno) -> NodeEntry
    func remove(_ name: [UInt8], in parent: UInt64, directory: Bool) throws(Errno)
    func rename(
        _ name: [UInt8], in parent: UInt64, to newName: [UInt8], in newParent: UInt64, flags: UInt32) throws(Errno)
    func link(_ node: UInt64, as name: [UInt8], in newParent: UInt64) throws(Errno) -> NodeEntry

    /// Returns the new handle.
    func openFile(_ node: UInt64, _ options: OpenOptions) throws(Errno) -> UInt64
    /// Returns the file's entry and the new handle.
    func createFile(
        _ name: [UInt8], in parent: UInt64, mode: UInt32, _ options: OpenOptions
    ) throws(Errno) -> (NodeEntry, UInt64)
    /// At most `count` bytes from `offset` (fewer at the end of the file).
    func read(_ node: UInt64, handle: UInt64, at offset: Int64, count: Int) throws(Errno) -> Data
    /// Returns how many bytes were written (all, or an error).
    func write(
        _ node: UInt64, handle: UInt64, _ data: UnsafeRawBufferPointer, at offset: Int64, killsSetID: Bool,
        _ request: RequestContext
    ) throws(Errno) -> Int
    func release(_ node: UInt64, handle: UInt64)
    func synchronize(_ node: UInt64, handle: UInt64, dataOnly: Bool) throws(Errno)
    func allocate(
        _ node: UInt64, handle: UInt64, at offset: Int64, length: Int64, mode: UInt32, _ request: RequestContext)
        throws(Errno)
    func fileSystemStatus(_ node: UInt64) throws(Errno) -> statvfs

    /// Returns the new handle.
    func openDirectory(_ node: UInt64) throws(Errno) -> UInt64
    /// Adds entries from the directory's `offset` to `listing` until it is full.
    func readDirectory(
        _ node: UInt64, handle: UInt64, from offset: Int64, into listing: inout DirectoryListing) throws(Errno)
    func releaseDirectory(_ node: UInt64, handle: UInt64)
    func synchronizeDirectory(_ node: UInt64, handle: UInt64, dataOnly: Bool) throws(Errno)

    /// An attribute's value, at most `XATTR_SIZE_MAX` bytes.
    func extendedAttribute(_ name: [UInt8], of node: UInt64) throws(Errno) -> [UInt8]
    func setExtendedAttribute(_ name: [UInt8], of node: UInt64, to value: [UInt8], flags: Int32) throws(Errno)
    /// The names listed, each without its NUL.
    func extendedAttributeNames(of node: UInt64) throws(Errno) -> [[UInt8]]
    func removeExtendedAttribute(_ name: [UInt8], of node: UInt64) throws(Errno)
}

/// The request being answered, for operations that run long: whether the kernel asked to
/// interrupt it (its program got a signal).
struct RequestContext: Sendable {
    let unique: UInt64
    let interrupts: InterruptedRequests?

    /// Whether the kernel asked to interrupt this request.
    var isInterrupted: Bool { interrupts?.contains(unique) ?? false }

    /// A request that is never interrupted (one the file system makes for itself).
    static let uninterruptible = RequestContext(unique: 0, interrupts: nil)
}

/// An inode's attributes as the kernel is given them: the backing item's status, with the size
/// programs see (a protected file's plaintext size).
struct NodeAttributes {
    var status: stat
    var size: UInt64
}

/// A name found or made: the node the kernel will refer to it by, and its attributes. Each one
/// given counts a lookup the kernel later forgets (``FileSystemOperations/forget(_:count:)``).
struct NodeEntry {
    var node: UInt64
    var attributes: NodeAttributes
}
