import Foundation
import SystemPackage

/// Giving inodes back to the kernel when the table fills (FORMAT.md §14, *The inode table*).
extension ProtectedFileSystem {
    /// Gives back the least recently found nodes that nothing holds open, down to the table's
    /// low-water mark: the kernel is asked to forget their names (`FUSE_NOTIFY_INVAL_ENTRY`), and
    /// the FORGETs that follow close their descriptors. Run from a thread that serves no request.
    ///
    /// Never a directory, nor a reserved name: invalidating an entry detaches whatever is mounted
    /// on it or below it, in every mount namespace (a sandbox's binds of its containers and of
    /// their metadata), and a directory may be a program's working directory.
    func evictUnused(_ replier: KernelReplier) {
        defer { nodes.evictionDone() }
        for candidate in nodes.evictionCandidates(sparing: { reservedNames.contains($0) }) {
            replier.invalidate(entry: candidate.name, in: candidate.parent)
        }
    }
}
