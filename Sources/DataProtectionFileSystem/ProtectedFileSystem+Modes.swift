import DataProtectionSystem
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The modes of items made through the mount. The kernel applies the caller's umask to the mode
/// of a CREATE, MKDIR or MKNOD before sending it (this server does not ask for
/// `FUSE_DONT_MASK`): the mode it sends is the mode the item must get, as on tmpfs. Each serving
/// thread therefore runs without a umask of its own (``SystemCall/unshareFileSystemAttributesWithoutUmask()``);
/// where the
/// kernel refuses that, each item made is given its mode afterwards (one call more).
extension ProtectedFileSystem {
    /// Whether every serving thread runs without a umask (else modes are set after making).
    static let serverUmaskIsOff = Atomic<Bool>(true)

    /// A serving thread could not drop its umask: items are given their modes after being made.
    static func noteServerUmaskApplies(errno code: Int32, logger: Logger) {
        if serverUmaskIsOff.exchange(false, ordering: .relaxed) {
            logger.notice(
                "serving threads keep the process's umask (unshare(CLONE_FS): \(String(cString: strerror(code)))); each item made is given the caller's mode afterwards"
            )
        }
    }

    /// Gives `name` in `parent`, just made with `mode`, that mode exactly when the server's umask
    /// may have masked it.
    func applyModeIfMasked(_ mode: UInt32, name: [UInt8], in parent: FileNode) {
        guard !Self.serverUmaskIsOff.load(ordering: .relaxed) else { return }
        // On the item itself, never through a link swapped in meanwhile; a directory keeps the
        // set-group-ID bit it inherited from its parent, as tmpfs gives it.
        let fd = withName(name) { openat(parent.fd, $0, O_PATH | O_NOFOLLOW | O_CLOEXEC) }
        guard fd >= 0 else { return }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT != S_IFLNK else { return }
        let inherited = st.st_mode & S_IFMT == S_IFDIR ? st.st_mode & S_ISGID : 0
        _ = chmod("/proc/self/fd/\(fd)", mode | inherited)
    }
}
