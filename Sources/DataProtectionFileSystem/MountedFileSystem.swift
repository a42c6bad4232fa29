import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// A mounted ``ProtectedFileSystem``: serve it until it is unmounted (``unmount()``,
/// `dpctl umount`, `fusermount3 -u`), or until this process ends — the mount is then released
/// (`auto_unmount`), and programs still using it get `ENOTCONN`.
public final class MountedFileSystem: Sendable {
    public let fileSystem: ProtectedFileSystem
    let device: FUSEDevice
    /// The mount point.
    public var mountPoint: String { device.mountPoint }
    /// The largest WRITE the kernel sends (and the read buffer's size beyond the headers).
    static let maxWrite = 1 << 20
    /// Threads reading requests: both cores busy while requests wait on the disk, and room for
    /// others while a few run long (a large zero fill).
    static let threads = 8
    /// Threads are added while every one is busy (a long request — a zero fill, a slow disk —
    /// never leaves the others unserved), up to this many.
    static let maxThreads = 64
    private let unmounted = Mutex(false)
    /// Serving threads, and how many wait for a request.
    private let pool = Mutex<(total: Int, idle: Int)>((0, 0))
    private let running = DispatchGroup()
    /// Requests the kernel asked to interrupt, whichever thread serves them.
    private let interrupts = InterruptedRequests()

    init(fileSystem: ProtectedFileSystem, device: FUSEDevice) {
        self.fileSystem = fileSystem
        self.device = device
    }

    /// Serves requests until the file system is unmounted. Lock-state changes of the device
    /// (keybagd's, when one runs) apply to the mount while it serves.
    public func serve() async {
        // Plaintext passes through buffers that are freed once answered: freed memory is
        // overwritten (glibc's M_PERTURB), so that no class-A plaintext outlives its request in
        // this process's heap once the lock drops the files' keys and caches.
        SystemCall.overwriteFreedMemory()
        let observers = await fileSystem.observeLockState(replier: KernelReplier(fd: device.fd))
        raiseReadahead()
        defer { Task { [fileSystem] in await fileSystem.stopObserving(observers) } }
        let evicting = Mutex(true)
        let evictor = Thread { [fileSystem, device] in
            // On a thread of its own: the kernel may need a serving thread to act on the notice.
            let replier = KernelReplier(fd: device.fd)
            // Ahead of the programs it makes room for, where the server may (root, or
            // CAP_SYS_NICE): each notice takes its directory's lock, which a program making
            // files there takes back first whenever it runs first (the kernel hands a waiting
            // writer the lock only after some 4 ms). At the programs' priority, on a busy
            // machine, the evictor wakes late and gives back fewer names than one program makes
            // meanwhile, and the others are refused.
            _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), id_t(SystemCall.gettid()), -10)
            while true {
                fileSystem.nodes.overflowing.wait()
                guard evicting.withLock({ $0 }) else { return }
                let start = Self.threadCPUTime()
                fileSystem.evictUnused(replier)
                // A fifth of a core at most, whatever asks for passes: a pass that took a
                // millisecond or more (a large table) is followed by four times as long asleep.
                let spent = Self.threadCPUTime() - start
                if spent >= 1_000 { usleep(UInt32(min(4 * spent, 2_000_000))) }
            }
        }
        evictor.start()
        defer {
            evicting.withLock { $0 = false }
            fileSystem.nodes.overflowing.signal()
        }
        for _ in 0..<Self.threads { startThread() }
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            running.notify(queue: .global()) { done.resume() }
        }
        close(device.fd)
        device.monitor?.release()
    }

    /// The calling thread's CPU time, in microseconds.
    private static func threadCPUTime() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
        return UInt64(time.tv_sec) * 1_000_000 + UInt64(time.tv_nsec) / 1_000
    }

    /// Read-ahead asked of the mount (KiB): sequential reads come as requests of up to 1 MiB
    /// rather than the kernel's default 128 KiB — a third fewer round trips' cost, measured.
    static let readaheadKiB = 1024

    /// Sets the mount's read-ahead (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`, writable by root
    /// only; an ordinary user's mount keeps the kernel's default). From a thread of its own: the
    /// `stat` that finds the mount's device is answered by the serving threads.
    private func raiseReadahead() {
        guard geteuid() == 0 else { return }
        let mountPoint = device.mountPoint
        Thread.detachNewThread {
            var st = stat()
            guard stat(mountPoint, &st) == 0 else { return }
            let dev = UInt64(st.st_dev)
            let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & ~UInt64(0xfff))
            let minor = (dev & 0xff) | ((dev >> 12) & ~UInt64(0xff))
            guard let handle = FileHandle(forWritingAtPath: "/sys/class/bdi/\(major):\(minor)/read_ahead_kb") else {
                return
            }
            try? handle.write(contentsOf: Data("\(Self.readaheadKiB)\n".utf8))
            try? handle.close()
        }
    }

    /// One serving thread: reads a request, answers it, until the device says the mount is gone.
    /// One more serving thread (counted in ``running`` until it ends, at the unmount).
    private func startThread() {
        pool.withLock { $0.total += 1 }
        running.enter()
        let thread = Thread { [self] in
            serveRequests()
            running.leave()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }

    private func serveRequests() {
        let size = Self.maxWrite + 64 * 1024
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 16)
        defer { buffer.deallocate() }
        let session = KernelSession(
            operations: fileSystem, replier: KernelReplier(fd: device.fd), interrupts: interrupts,
            maxWrite: Self.maxWrite)
        // The caller's kernel masked a create's mode with the caller's umask already: this
        // thread makes items with the mode it is given, never masked again by the server's umask.
        do throws(Errno) { try SystemCall.unshareFileSystemAttributesWithoutUmask() } catch {
            ProtectedFileSystem.noteServerUmaskApplies(errno: error.rawValue, logger: fileSystem.logger)
        }
        while true {
            pool.withLock { $0.idle += 1 }
            let n = Glibc.read(device.fd, buffer.baseAddress, size)
            // The last idle thread took a request: one more waits for the next.
            let grow = pool.withLock { pool -> Bool in
                pool.idle -= 1
                return pool.idle == 0 && pool.total < Self.maxThreads
            }
            if grow, n > 0 { startThread() }
            if n < 0 {
                switch errno {
                case EINTR, EAGAIN, ENOENT: continue   // ENOENT: a request interrupted before it was read
                default: return   // ENODEV: unmounted
                }
            }
            if n == 0 { return }
            session.answer(UnsafeRawBufferPointer(rebasing: buffer[0..<n])) { Requester.begin(pid: $0.pid) }
        }
    }

    /// Unmounts (lazily: programs still inside keep what they hold until they leave); ``serve()``
    /// then returns.
    public func unmount() throws {
        guard
            !unmounted.withLock({
                let was = $0; $0 = true; return was
            })
        else { return }
        // The fusermount3 that made the mount unmounts it as it ends (one unmount, no complaint
        // from a second); else, or if it does not end, an unmount of our own.
        if let monitor = device.monitor, monitor.unmount(waiting: 10), !FUSEDevice.isMounted(device.mountPoint) {
            return
        }
        try FUSEDevice.unmount(device.mountPoint)
    }

    /// Throws ``MountError/unavailable(_:)`` when this machine cannot mount a
    /// protected file system (no `/dev/fuse`; no `fusermount3` for an ordinary user), before
    /// anything else is done.
    public static func checkAvailability() throws { try FUSEDevice.checkAvailability() }

    /// Unmounts the file system at `mountPoint`, served by whatever process (`dpctl umount`).
    public static func unmount(_ mountPoint: String) throws {
        // Never a look at the mount point itself (`URL(fileURLWithPath:)` without `isDirectory`
        // stats it to find out): a server that stopped answering would hang that look, and the
        // unmount is what ends it.
        try FUSEDevice.unmount(URL(fileURLWithPath: mountPoint, isDirectory: true).standardizedFileURL.path)
    }
}

/// `RLIMIT_NOFILE`, as Glibc's module gives it.
