import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The sandboxed apps a shared mount serves (``ProtectedFileSystem/apps``), each known by its
/// sandbox's PID namespace, with its *territories*: the directories (an app's container, its
/// groups' containers) below which it works as the owner of what it finds.
///
/// Outside its territories an app reaches only what it was handed as a descriptor (a grant, a
/// share), and it may do no more than the descriptor allows: read it, write it if it was opened
/// for writing (and truncate it, and touch its times, through it). Reopening it for writing
/// through `/proc/self/fd`, changing its mode, owner, explicit times, class or attributes, and
/// making or removing names beside it are refused (`EACCES`, `EPERM`) — though the file's mode
/// and owner would let the kernel allow them.
///
/// An admitted app's nodes also count in one share of the inode table whichever run made them
/// (``NodeTable``): a relaunched app finds its earlier runs' directories in its own share.
/// Programs of no admitted app (outside every sandbox) are not limited here.
public final class ServedApps: Sendable {
    /// An admitted app, as a request from its sandbox finds it.
    struct App: Sendable {
        /// The admission it came with (one per sandbox).
        let admission: UInt64
        /// Its key in the inode table's shares: the same for every run of the app.
        let owner: UInt64
        /// The backing directories it owns the subtrees of, by device and inode.
        let territories: Set<InodeIdentity>
    }

    private struct State {
        /// By PID namespace (inode number), each with the descriptor that keeps the number from
        /// going to another namespace while admitted.
        var byNamespace: [UInt64: (app: App, pins: [Int32])] = [:]
        /// The table key of each app name ever admitted.
        var owners: [String: UInt64] = [:]
        var nextAdmission: UInt64 = 1
    }
    private let state = Mutex(State())

    /// Table keys of apps have the top bit set: PID namespace numbers (the key of programs of no
    /// admitted app) never do.
    static let appOwnerBit: UInt64 = 1 << 63

    public init() {}

    /// An app's stay: its sandbox is served as the app until ``end()`` (or until this is freed)
    /// and the sandbox has ended.
    public final class Admission: Sendable {
        private let apps: ServedApps
        private let id: UInt64
        private let namespace: UInt64
        /// A descriptor of the sandbox's first process: when it has ended, so has every process
        /// of the sandbox (the first process of a PID namespace ends last).
        private let process: Mutex<Int32>

        fileprivate init(apps: ServedApps, id: UInt64, namespace: UInt64, process: Int32) {
            self.apps = apps
            self.id = id
            self.namespace = namespace
            self.process = Mutex(process)
        }

        /// Ends the admission once the sandbox has ended: requests from it are then those of any
        /// program. A supervisor that dies closes its lease before its sandbox is killed; until
        /// the sandbox's last process is gone, it stays served as the app.
        public func end() {
            let process = process.withLock {
                let fd = $0; $0 = -1; return fd
            }
            guard process >= 0 else { return }
            let (apps, namespace, id) = (self.apps, self.namespace, self.id)
            var poller = pollfd(fd: process, events: Int16(POLLIN), revents: 0)
            if poll(&poller, 1, 0) == 1 || !SystemCall.pidfdIsRunning(process) {
                apps.remove(namespace: namespace, admission: id)
                close(process)
                return
            }
            Thread {
                var poller = pollfd(fd: process, events: Int16(POLLIN), revents: 0)
                while poll(&poller, 1, -1) < 0, errno == EINTR {}
                apps.remove(namespace: namespace, admission: id)
                close(process)
            }.start()
        }

        deinit { end() }
    }

    /// Admits the sandbox whose process `pid` is (its PID namespace: every process of the app)
    /// as `app`, owning the subtrees of `territories` (directories of the served tree, by their
    /// backing paths). A second admission of the same namespace replaces the first.
    ///
    /// - Throws: ``MountError/system(_:_:)`` when the process is gone, or a territory
    ///   is not a directory.
    public func admit(sandboxProcess pid: Int32, app: String, territories: [String]) throws -> Admission {
        // Each territory held open while admitted: its inode number never goes to another
        // directory meanwhile.
        var identities = Set<InodeIdentity>(), held: [Int32] = []
        var admitted = false
        defer { if !admitted { held.forEach { close($0) } } }
        for path in territories {
            let fd = open(path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else { throw MountError.system("open \(path)", Errno(rawValue: errno)) }
            held.append(fd)
            var st = stat()
            guard fstat(fd, &st) == 0 else {
                throw MountError.system("stat \(path)", Errno(rawValue: errno))
            }
            identities.insert(InodeIdentity(st))
        }
        // The process first, then its namespace, then the process checked alive: the namespace
        // read is that process's, not one whose number went to another meanwhile.
        let process: Int32
        do throws(Errno) { process = try SystemCall.pidfdOpen(pid_t(pid)) } catch {
            throw MountError.system("the sandbox's process \(pid)", error)
        }
        let pin = open("/proc/\(pid)/ns/pid", O_RDONLY | O_CLOEXEC)
        guard pin >= 0 else {
            let code = errno; close(process);
            throw MountError.system("the sandbox's PID namespace (process \(pid))", Errno(rawValue: code))
        }
        var st = stat(), own = stat()
        guard fstat(pin, &st) == 0, SystemCall.pidfdIsRunning(process) else {
            close(pin); close(process)
            throw MountError.system("the sandbox's process \(pid)", Errno(rawValue: ESRCH))
        }
        // A sandbox has a PID namespace of its own: never admit the server's (every program
        // outside a sandbox would then count as the app).
        guard stat("/proc/self/ns/pid", &own) == 0, own.st_ino != st.st_ino else {
            close(pin); close(process)
            throw MountError.system("process \(pid) is not in a sandbox of its own", Errno(rawValue: EINVAL))
        }
        let namespace = UInt64(st.st_ino)
        admitted = true
        let pins = held + [pin]
        let (id, replaced) = state.withLock { state -> (UInt64, [Int32]) in
            let id = state.nextAdmission
            state.nextAdmission += 1
            let owner: UInt64
            if let known = state.owners[app] {
                owner = known
            } else {
                owner = Self.appOwnerBit | UInt64(state.owners.count + 1)
                state.owners[app] = owner
            }
            let replaced = state.byNamespace[namespace]?.pins ?? []
            state.byNamespace[namespace] = (App(admission: id, owner: owner, territories: identities), pins)
            return (id, replaced)
        }
        replaced.forEach { close($0) }
        return Admission(apps: self, id: id, namespace: namespace, process: process)
    }

    fileprivate func remove(namespace: UInt64, admission: UInt64) {
        let pins = state.withLock { state -> [Int32] in
            guard let entry = state.byNamespace[namespace], entry.app.admission == admission else { return [] }
            state.byNamespace[namespace] = nil
            return entry.pins
        }
        pins.forEach { close($0) }
    }

    /// The app admitted with PID namespace `namespace`, if any.
    func app(inNamespace namespace: UInt64) -> App? {
        guard namespace != 0 else { return nil }
        return state.withLock { $0.byNamespace.isEmpty ? nil : $0.byNamespace[namespace]?.app }
    }

    /// Who sent the request this serving thread answers, as far as apps go.
    enum Requesting {
        /// No app is admitted, or the request comes from outside every admitted sandbox.
        case unconfined
        case app(App)
        /// Apps are admitted and the process cannot be told any more (it ended while its
        /// request was under way): it may have been one of them.
        case unknown
    }

    var requesting: Requesting {
        if state.withLock({ $0.byNamespace.isEmpty }) { return .unconfined }
        let namespace = Requester.namespace
        guard namespace != 0 else { return .unknown }
        return app(inNamespace: namespace).map { .app($0) } ?? .unconfined
    }
}
