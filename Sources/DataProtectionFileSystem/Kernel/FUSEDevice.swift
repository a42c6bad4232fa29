import CFUSEKernel
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The kernel end of a mount: `/dev/fuse`, opened and mounted — through `fusermount3` (Debian
/// `fuse3`, setuid: how an ordinary user mounts, and how a mount is released when its server
/// dies, `auto_unmount`) or, as root without it, with `mount(2)`.
struct FUSEDevice: Sendable {
    /// The descriptor requests are read from and replies written to.
    let fd: Int32
    /// The mount point, absolute.
    let mountPoint: String
    /// Our end of `fusermount3`'s socket: it stays (`auto_unmount`) until this closes — when
    /// this process ends, however it ends — and then unmounts.
    var monitor: FusermountMonitor?

    static let fsName = "dataprotection"

    /// `fusermount3` on `PATH` or in the usual places.
    static func fusermount() -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for directory in path.split(separator: ":").map(String.init) + ["/usr/bin", "/bin"] {
            let candidate = directory + "/fusermount3"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }

    /// Throws when this machine lacks what mounting needs: `/dev/fuse`, and `fusermount3`
    /// unless this process is root.
    static func checkAvailability() throws {
        guard access("/dev/fuse", R_OK | W_OK) == 0 else {
            throw MountError.unavailable(
                "/dev/fuse is missing or not usable (load the fuse module, or give the container /dev/fuse)")
        }
        guard fusermount() != nil || geteuid() == 0 else {
            throw MountError.unavailable("fusermount3 is not installed: apt-get install fuse3")
        }
    }

    /// Mounts a new FUSE file system at `mountPoint` and returns its device.
    ///
    /// - Parameter kernelChecksPermissions: `default_permissions`, the kernel checking modes and
    ///   owners with each caller's own credentials and capabilities before a request is sent.
    static func mount(
        at mountPoint: String, allowOther: Bool = false, kernelChecksPermissions: Bool = false
    ) throws -> FUSEDevice {
        try checkAvailability()
        var st = stat()
        guard stat(mountPoint, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else {
            throw MountError.badMountPoint(mountPoint, "is not a directory")
        }
        // No `default_permissions`: without `allow_other` every caller has this server's user ID,
        // so the backing file system checks each call as the kernel would (the server makes the
        // same call on the same inode), and ACCESS answers `access`/`chdir`. With it, the kernel
        // asks for a directory's attributes again before each create and remove (one round trip
        // more per file); with `allow_other` it is needed and set, and so it is when asked (a
        // server run as root for callers without capabilities: see ProtectedFileSystem).
        let checks =
            (allowOther ? ",allow_other" : "") + (allowOther || kernelChecksPermissions ? ",default_permissions" : "")
        let options = "rw,nosuid,nodev,fsname=\(fsName),subtype=\(fsName)" + checks
        if let fusermount = fusermount() {
            return try mountThroughFusermount(fusermount, at: mountPoint, options: options + ",auto_unmount")
        }
        guard geteuid() == 0 else {
            throw MountError.unavailable("fusermount3 is not installed: apt-get install fuse3")
        }
        let fd = open("/dev/fuse", O_RDWR | O_CLOEXEC)
        guard fd >= 0 else { throw MountError.system("open /dev/fuse", Errno(rawValue: errno)) }
        let data = "fd=\(fd),rootmode=40000,user_id=\(getuid()),group_id=\(getgid())" + checks
        guard Glibc.mount(fsName, mountPoint, "fuse." + fsName, UInt(MS_NOSUID | MS_NODEV), data) == 0 else {
            let code = errno
            close(fd)
            throw MountError.system("mount \(mountPoint)", Errno(rawValue: code))
        }
        return FUSEDevice(fd: fd, mountPoint: mountPoint)
    }

    /// `fusermount3 -o OPTIONS -- MOUNTPOINT` with `_FUSE_COMMFD`: it opens `/dev/fuse`, mounts it
    /// and sends the descriptor back over a socket pair.
    private static func mountThroughFusermount(
        _ fusermount: String, at mountPoint: String, options: String
    ) throws -> FUSEDevice {
        var pair: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            throw MountError.system("socketpair", Errno(rawValue: errno))
        }
        // fusermount3 gets the socket as descriptor 3.
        let (spawned, pid) = spawn(fusermount, ["-o", options, "--", mountPoint], socket: pair[1])
        close(pair[1])
        guard spawned == 0 else {
            close(pair[0])
            throw MountError.system("running \(fusermount)", Errno(rawValue: spawned))
        }
        var byte: UInt8 = 0
        let received = withUnsafeMutableBytes(of: &byte) { try? SystemCall.recvmsg(pair[0], $0) }
        // fusermount3 lives on (auto_unmount) until our end of the socket closes: reaped then.
        let monitor = FusermountMonitor(socket: pair[0], pid: pid)
        guard let received, received.count > 0, let fd = received.descriptor else {
            monitor.release()
            throw MountError.badMountPoint(
                mountPoint, "fusermount3 could not mount it (its message is above)")
        }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        var device = FUSEDevice(fd: fd, mountPoint: mountPoint)
        device.monitor = monitor
        return device
    }

    /// Starts `fusermount3 ARGUMENTS` with standard input and output on /dev/null, its errors on
    /// ours, and `socket` (if any) as descriptor 3 named by `_FUSE_COMMFD`. Returns 0 or an errno,
    /// and the process.
    private static func spawn(_ fusermount: String, _ arguments: [String], socket: Int32? = nil) -> (Int32, pid_t) {
        let devNull = open("/dev/null", O_RDWR | O_CLOEXEC)
        defer { if devNull >= 0 { close(devNull) } }
        let sources: [Int32] = [devNull, devNull, 2] + (socket.map { [$0] } ?? [])
        let environment = (socket == nil ? [] : ["_FUSE_COMMFD=3"]) + ["PATH=/usr/bin:/bin"]
        let spawned = withCStrings([fusermount] + arguments) { argv in
            withCStrings(environment) { envp in
                Result { () throws(Errno) in try SystemCall.spawn(fusermount, argv, envp, descriptors: sources) }
            }
        }
        switch spawned {
        case .success(let pid): return (0, pid)
        case .failure(let error): return (error.rawValue, 0)
        }
    }

    /// Unmounts `mountPoint` (lazily: programs still inside keep what they hold until they leave).
    static func unmount(_ mountPoint: String) throws {
        guard isMounted(mountPoint) else { return }   // gone already (its server ended: auto_unmount)
        if let fusermount = fusermount() {
            let (spawned, pid) = spawn(fusermount, ["-u", "-z", "--", mountPoint])
            guard spawned == 0 else {
                throw MountError.system("running \(fusermount)", Errno(rawValue: spawned))
            }
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
            if status == 0 { return }
            if geteuid() != 0 {
                throw MountError.badMountPoint(
                    mountPoint, "could not be unmounted (fusermount3's message is above)")
            }
        }
        guard umount2(mountPoint, Int32(MNT_DETACH)) == 0 else {
            throw MountError.system("umount \(mountPoint)", Errno(rawValue: errno))
        }
    }
}

/// The `fusermount3` that stays beside a mount it made (`auto_unmount`): closing our end of its
/// socket makes it unmount (lazily, quietly) and end.
final class FusermountMonitor: Sendable {
    private let socket: Int32
    private let released = Mutex(false)
    private let exited = DispatchSemaphore(value: 0)

    init(socket: Int32, pid: pid_t) {
        self.socket = socket
        Thread.detachNewThread { [exited] in
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
            exited.signal()
        }
    }

    /// Closes our end (once): fusermount3 unmounts and ends.
    func release() {
        guard
            !released.withLock({
                let was = $0; $0 = true; return was
            })
        else { return }
        close(socket)
    }

    /// Releases it and waits (at most `seconds`) until it has unmounted and ended; whether it did.
    func unmount(waiting seconds: Int) -> Bool {
        release()
        return exited.wait(timeout: .now() + .seconds(seconds)) == .success
    }
}

extension FUSEDevice {
    /// Whether something is mounted at `path` (`/proc/self/mountinfo`'s fifth field, whose
    /// spaces, tabs, newlines and backslashes are octal escapes).
    static func isMounted(_ path: String) -> Bool { MountTable.isMountPoint(path) }
}

/// Runs `body` with `strings` as a NULL-terminated C array.
func withCStrings<T>(_ strings: [String], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> T) -> T {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    pointers.append(nil)
    defer { for pointer in pointers { free(pointer) } }
    return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
}
