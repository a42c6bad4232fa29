import DataProtection
import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The broker, served to one app by its supervisor (``AppSupervisorService`` 1; FORMAT.md
/// §11.4): the app's requests run as that app — the supervisor, not the app, says which it is —
/// and its deliveries are pushed to it once it subscribes.
///
/// ```swift
/// let supervisor = AppSupervisor(manager: manager, services: [SharingService(manager: manager)])
/// ```
public struct SharingService: AppSupervisorService {
    public let broker: SharingBroker
    private let logger = Logger(label: "sharing")

    public init(manager: ContainerManager) {
        broker = SharingBroker(manager: manager)
    }

    public var serviceIdentifier: UInt8 { SharingProtocol.serviceIdentifier }

    public func appDidEnd(_ run: RunningApp) {
        broker.endTransientGrants(of: run.app)
    }

    public func serve(channel: FileDescriptor, run: RunningApp) {
        serve(channel: channel, app: run.app, servedPath: run.servedPath)
    }

    /// Serves one sharing channel of `app` (FORMAT.md §11.4) until the app closes it.
    /// - Parameter servedPath: where the protected file system serves a container path, when it
    ///   serves the app's: descriptors handed to it are opened there (plaintext, no key needed).
    public func serve(channel: FileDescriptor, app: AppContainer, servedPath: (@Sendable (String) -> String)? = nil) {
        let fd = channel.rawValue
        UnixSocket.setTimeouts(fd, seconds: 10, sending: true, receiving: false)
        /// The grants this channel started access to, and what it keeps open for them.
        var session = GrantAccessSession()
        var answers = AnswerQueue(fd: fd)
        var requests = IPCFrameReader(fd: fd, acceptsDescriptors: false)
        defer { try? answers.flush(); requests.close(); session.close() }
        while let frame = try? requests.frame() {
            answers.requestBuffered = requests.hasBufferedBytes
            var r = ByteReader(frame)
            guard (try? r.u8("version")) == SharingProtocol.version, let raw = try? r.u8("op"),
                let op = SharingProtocol.Op(rawValue: raw)
            else {
                logger.info("closing \(app.identifier)'s sharing channel: malformed request")
                return
            }
            // A start's check carries over only to the open sent with it.
            if op != .open { session.clearPipelinedCheck() }
            switch op {
            case .openIn:
                guard let target = try? SharingProtocol.string(&r, "target"),
                    let path = try? SharingProtocol.string(&r, "path"),
                    let name = try? SharingProtocol.string(&r, "name"), r.remaining == 0
                else { return }
                let answer = outcome { () async throws -> Void in
                    _ = try await broker.openIn(
                        path, from: app.identifier, to: try AppIdentifier(target),
                        displayName: name.isEmpty ? nil : name)
                }
                guard (try? answers.send(answer)) != nil else { return }
            case .subscribe:
                let mask = r.remaining == 1 ? (try? r.u8("kinds")) ?? 0 : SharingProtocol.openedMask
                // Nothing may follow a subscription: the channel carries events from here on.
                guard r.remaining == 0, mask != 0, !requests.hasBufferedBytes,
                    (try? answers.send(SharingProtocol.ok)) != nil, (try? answers.flush()) != nil
                else { return }
                var kinds: Set<Delivery.Kind> = []
                if mask & SharingProtocol.openedMask != 0 { kinds.insert(.openIn) }
                if mask & SharingProtocol.sharedMask != 0 { kinds.insert(.share) }
                deliver(kinds, to: fd, app: app)
                return
            case .share:
                guard let target = try? SharingProtocol.string(&r, "target"),
                    let path = try? SharingProtocol.string(&r, "path"),
                    let live = try? r.u8("live"), live <= 1, r.remaining == 0
                else { return }
                let answer = outcome {
                    _ = try broker.share(path, from: app.identifier, with: try AppIdentifier(target), live: live == 1)
                }
                guard (try? answers.send(answer)) != nil else { return }
            case .grant:
                guard let target = try? SharingProtocol.string(&r, "target"),
                    let path = try? SharingProtocol.string(&r, "path"),
                    let raw = try? r.u8("capabilities"), let lifetime = try? r.u32("lifetime"),
                    let persistent = try? r.u8("persistent"),
                    persistent <= 1, r.remaining == 0
                else { return }
                var made: Grant?
                let answer = outcome {
                    made = try broker.grant(
                        path, from: app.identifier, to: try AppIdentifier(target),
                        capabilities: GrantCapabilities(rawValue: raw & 0x3F),
                        expiresAfter: lifetime == 0 ? nil : TimeInterval(lifetime), persistent: persistent == 1,
                        by: .providingApp)
                }
                var reply = ByteWriter()
                reply.raw(answer)
                if let made { SharingProtocol.uuid(&reply, made.id) }
                guard (try? answers.send(reply.bytes)) != nil else { return }
            case .endShare:
                guard let id = try? SharingProtocol.uuid(&r), r.remaining == 0 else { return }
                session.started.remove(id)
                guard (try? answers.send(outcome { try broker.endShare(id, for: app) })) != nil else { return }
            case .startAccess, .stopAccess:
                guard let id = try? SharingProtocol.uuid(&r), r.remaining == 0 else { return }
                let answer: [UInt8]
                if op == .stopAccess {
                    session.started.remove(id)
                    answer = SharingProtocol.ok
                } else {
                    answer = outcome {
                        let (grant, provider) = try broker.activeGrantAndProvider(id, for: app)
                        session.didStart(id, grant: grant, provider: provider, pipelined: requests.hasBufferedBytes)
                    }
                }
                guard (try? answers.send(answer)) != nil else { return }
            case .open:
                guard let id = try? SharingProtocol.uuid(&r), let mode = try? r.u8("mode"), mode <= 1,
                    let subpath = try? SharingProtocol.string(&r, "subpath"), r.remaining == 0
                else { return }
                var opened: FileDescriptor?
                defer { session.clearPipelinedCheck() }
                let answer =
                    session.started.contains(id)
                    ? outcome {
                        opened = try broker.openGranted(
                            id, subpath: subpath, writable: mode == 1, for: app, session: &session,
                            servedPath: servedPath)
                    }
                    : SharingProtocol.failure(.refused, SharingError.accessNotStarted(id).description)
                defer { try? opened?.close() }
                guard (try? answers.send(answer)) != nil else { return }
                if let opened { guard (try? answers.send(descriptor: opened.rawValue)) != nil else { return } }
            case .enumerate, .create, .rename, .delete:
                guard let id = try? SharingProtocol.uuid(&r), let subpath = try? SharingProtocol.string(&r, "subpath")
                else { return }
                let newName = op == .rename ? try? SharingProtocol.string(&r, "name") : ""
                guard let newName, r.remaining == 0 else { return }
                var extra: [UInt8] = []
                var created: FileDescriptor?
                defer { try? created?.close() }
                let answer =
                    !session.started.contains(id)
                    ? SharingProtocol.failure(.refused, SharingError.accessNotStarted(id).description)
                    : outcome {
                        switch op {
                        case .enumerate:
                            extra = try binaryPropertyList(try broker.enumerateGranted(id, subpath: subpath, for: app))
                        case .create:
                            let (descriptor, cls) = try broker.createGranted(
                                id, subpath: subpath, for: app, servedPath: servedPath)
                            created = descriptor
                            extra = [cls.rawValue]
                        case .rename: try broker.renameGranted(id, subpath: subpath, to: newName, for: app)
                        default: try broker.deleteGranted(id, subpath: subpath, for: app)
                        }
                    }
                guard (try? answers.send(answer == SharingProtocol.ok ? answer + extra : answer)) != nil else { return }
                if let created { guard (try? answers.send(descriptor: created.rawValue)) != nil else { return } }
            case .resolve:
                guard let id = try? SharingProtocol.uuid(&r), r.remaining == 0 else { return }
                var extra: [UInt8] = []
                let answer = outcome {
                    let (grant, stale) = try broker.resolveGrant(id, for: app)
                    extra =
                        [stale ? 1 : 0]
                        + (try binaryPropertyList(GrantedItemRecord(grant, provider: try broker.provider(of: grant))))
                }
                guard (try? answers.send(answer == SharingProtocol.ok ? answer + extra : answer)) != nil else { return }
            case .list:
                guard r.remaining == 0 else { return }
                let items = GrantStore(layout: broker.manager.layout).grants(involving: app.uuid)
                    .filter { $0.recipientContainer == app.uuid && !$0.isExpired(at: broker.clock.now()) }
                    .sorted { ($0.created, $0.id.uuidString) < ($1.created, $1.id.uuidString) }
                    .compactMap { grant in
                        (try? broker.provider(of: grant)).map { GrantedItemRecord(grant, provider: $0) }
                    }
                guard let plist = try? binaryPropertyList(items), (try? answers.send(SharingProtocol.ok + plist)) != nil
                else { return }
            }
        }
    }

    /// What an app is told when its target does not take the request, whether or not it exists.
    static func refusal(_ identifier: String) -> String { "\(identifier) does not accept this request" }

    /// Runs a request and makes its answer frame.
    private func outcome(_ body: @escaping @Sendable () async throws -> Void) -> [UInt8] {
        outcome { try runBlocking(body) }
    }

    private func outcome(_ body: () throws -> Void) -> [UInt8] {
        do {
            try body()
            return SharingProtocol.ok
        } catch let error as ProtectedFileError {
            if case .unavailable = error { return SharingProtocol.failure(.unavailable, error.description) }
            return SharingProtocol.failure(.refused, error.description)
        } catch ContainerError.unknownApp(let identifier) {
            // Which apps are installed is not an app's business (iOS restricts canOpenURL): an
            // unknown target is answered as a refusing one.
            return SharingProtocol.failure(.refused, Self.refusal(identifier.rawValue))
        } catch {
            return SharingProtocol.failure(.refused, String(describing: error))
        }
    }

    // MARK: - Deliveries

    /// Pushes the app's queued deliveries, then each new one as it is queued, until the app
    /// closes the channel. A record is claimed (renamed) before it is sent, so two subscribers
    /// never both deliver it; it is removed once sent and put back if the send fails, and a
    /// claim whose supervisor was killed is put back at the next subscription.
    private func deliver(_ kinds: Set<Delivery.Kind>, to fd: Int32, app: AppContainer) {
        let queue = DeliveryQueue(layout: broker.manager.layout, app: app.uuid)
        do { try broker.manager.layout.prepareSharing(); try makeSharingDirectory(queue.directory) } catch {
            logger.info("no delivery queue for \(app.identifier): \(error)")
            return
        }
        // inotify tells of new deliveries; without it (the user's instances all taken), the queue
        // is looked at every second instead: slower, never silently never.
        let watch = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        defer { if watch >= 0 { close(watch) } }
        let watching =
            watch >= 0 && inotify_add_watch(watch, queue.directory, UInt32(IN_MOVED_TO | IN_CLOSE_WRITE)) >= 0
        if !watching {
            logger.warning(
                "\(app.identifier)'s deliveries: no inotify (\(String(cString: strerror(errno)))), looking every second instead"
            )
        }
        queue.releaseAbandonedClaims()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            for (record, delivery) in queue.pending() where kinds.contains(delivery.kind) {
                guard let claimed = queue.claim(record) else { continue }
                guard (try? IPCFrame.write(fd, event(delivery, app: app))) != nil else {
                    queue.release(claimed)
                    return
                }
                queue.remove(claimed)
            }
            var fds = [
                pollfd(fd: watching ? watch : -1, events: Int16(POLLIN), revents: 0),
                pollfd(fd: fd, events: Int16(POLLIN), revents: 0),
            ]
            guard poll(&fds, 2, watching ? -1 : 1000) >= 0 || errno == EINTR else { return }
            if fds[1].revents != 0 { return }   // the app closed the channel (or wrote to it)
            while watching, read(watch, &buffer, buffer.count) > 0 {}   // drained: look at the directory again
        }
    }

    func event(_ delivery: Delivery, app: AppContainer) -> [UInt8] {
        var w = ByteWriter()
        w.u8(SharingProtocol.version)
        w.u8(SharingProtocol.Status.event.rawValue)
        switch delivery.kind {
        case .openIn:
            w.u8(SharingProtocol.EventKind.opened.rawValue)
            SharingProtocol.string(&w, app.inbox.appendingPathComponent(delivery.name).path)
            SharingProtocol.string(&w, delivery.sender)
        case .share:
            let id = UUID(uuidString: delivery.name) ?? UUID(bytes: [UInt8](repeating: 0, count: 16))
            let location =
                (try? broker.manager.app(AppIdentifier(delivery.sender)))
                .flatMap { sender in
                    GrantStore(layout: broker.manager.layout).grant(id).map {
                        sender.url.appendingPathComponent($0.path).path
                    }
                } ?? ""
            w.u8(SharingProtocol.EventKind.shared.rawValue)
            SharingProtocol.uuid(&w, id)
            SharingProtocol.string(&w, delivery.sender)
            SharingProtocol.string(&w, location)
        }
        return w.bytes
    }
}
