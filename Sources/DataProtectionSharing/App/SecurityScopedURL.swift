import DataProtection
import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// An item another app granted this one (a file-provider grant, or an exposed `Documents`),
/// used as iOS code uses a security-scoped URL:
///
/// ```swift
/// for item in try await app.grantedItems() {
///     guard item.startAccessingSecurityScopedResource() else { continue }
///     defer { item.stopAccessingSecurityScopedResource() }
///     let data = try await item.contents()                      // through a descriptor from the broker
///     try await item.write(Data("edited".utf8))                 // only with .writing: else EBADF
/// }
/// ```
///
/// The item lives in another app's container, which this sandbox cannot see: every access is a
/// descriptor the broker opens after checking the grant — read-only without `.writing`, so the
/// kernel refuses writes. Access must be started (the broker checks the grant then, and at
/// every open); a revoked or expired grant cannot start again. A descriptor already handed out
/// stays valid until closed — as on Apple's systems, permissions are checked at open.
public final class SecurityScopedURL: Sendable, Identifiable {
    public let id: UUID
    /// Where the item is (for display; opening it directly fails: use this object).
    public let url: URL
    /// The app that granted it.
    public let provider: String
    public let capabilities: GrantCapabilities
    public let expires: Date?
    public let isPersistent: Bool

    private let app: CurrentApp
    /// The channel on which access was started, and its reader; `nil` when not accessing.
    private let channel = Mutex<AccessChannel?>(nil)

    /// A sharing channel and what was read from it: answers and passed descriptors can arrive
    /// in one message, so every read goes through the one reader.
    private struct AccessChannel {
        let fd: FileDescriptor
        var reader: IPCFrameReader

        init(_ fd: FileDescriptor) {
            self.fd = fd
            reader = IPCFrameReader(fd: fd.rawValue)
        }

        mutating func close() {
            reader.close()
            try? fd.close()
        }
    }
    /// The item's read-only descriptor, asked for together with the start (one round trip
    /// instead of two for the common start-then-read), handed out by the first plain read.
    private let prefetched = Mutex<FileDescriptor?>(nil)

    init(_ record: GrantedItemRecord, app: CurrentApp) {
        id = record.id
        url = URL(fileURLWithPath: record.location)
        provider = record.provider
        capabilities = GrantCapabilities(rawValue: record.capabilities)
        expires = record.expires
        isPersistent = record.persistent
        self.app = app
    }

    /// A shared item from its event (FORMAT.md §11.4).
    init?(sharedEvent frame: [UInt8], app: CurrentApp) {
        var r = ByteReader(frame)
        guard (try? r.u8("version")) == SharingProtocol.version,
            (try? r.u8("status")) == SharingProtocol.Status.event.rawValue,
            (try? r.u8("kind")) == SharingProtocol.EventKind.shared.rawValue, let id = try? SharingProtocol.uuid(&r),
            let sender = try? SharingProtocol.string(&r, "sender"),
            let location = try? SharingProtocol.string(&r, "location")
        else { return nil }
        self.id = id
        url = URL(fileURLWithPath: location)
        provider = sender
        capabilities = .reading
        expires = nil
        isPersistent = false
        self.app = app
    }

    deinit { stopAccessingSecurityScopedResource() }

    /// Ends a share (or gives up a grant) made to this app: nothing more can be opened through it.
    public func endShare() async throws {
        stopAccessingSecurityScopedResource()
        try await app.ask(SharingProtocol.request(.endShare) { SharingProtocol.uuid(&$0, id) }, timeout: 30)
    }

    /// Starts access; `false` when the grant was revoked, has expired, or the broker is gone.
    /// Balance each successful call with ``stopAccessingSecurityScopedResource()``.
    @discardableResult
    public func startAccessingSecurityScopedResource() -> Bool {
        channel.withLock { current in
            if current != nil { return true }
            guard let fd = app.openServiceChannel(SharingProtocol.serviceIdentifier) else { return false }
            UnixSocket.setTimeouts(fd.rawValue, seconds: 30)
            // Start, and (pipelined) open the item for reading: the broker answers both in order
            // and checks the grant at each, so the open is refused when the start is.
            let start = SharingProtocol.request(.startAccess) { SharingProtocol.uuid(&$0, id) }
            let open = SharingProtocol.request(.open) { w in
                SharingProtocol.uuid(&w, id)
                w.u8(0)
                SharingProtocol.string(&w, "")
            }
            // one send, one wake-up
            let both = IPCFrame.header(start.count) + start + IPCFrame.header(open.count) + open
            var opening = AccessChannel(fd)
            guard (try? IPCFrame.sendBytes(fd.rawValue, both)) != nil,
                let answer = try? opening.reader.frame(), let opened = try? opening.reader.frame(),
                (try? SharingProtocol.outcome(answer)) == .some(nil)
            else {
                opening.close()
                return false
            }
            if (try? SharingProtocol.outcome(opened)) == .some(nil) {
                guard let descriptor = try? opening.reader.descriptor() else {
                    opening.close()
                    return false
                }
                prefetched.withLock { $0 = FileDescriptor(rawValue: descriptor) }
            }
            current = opening
            return true
        }
    }

    /// Ends access: no new descriptor is handed out until access starts again.
    public func stopAccessingSecurityScopedResource() {
        if let unused = prefetched.withLock({ fd -> FileDescriptor? in
            defer { fd = nil }; return fd
        }) {
            try? unused.close()
        }
        channel.withLock { current in
            guard var open = current else { return }
            _ = try? IPCFrame.write(
                open.fd.rawValue, SharingProtocol.request(.stopAccess) { SharingProtocol.uuid(&$0, id) })
            open.close()
            current = nil
        }
    }

    /// A descriptor of the item (or of `subpath` below a granted directory), from the broker.
    /// - Throws: ``SharingError/accessNotStarted(_:)``, `.notGranted`, `.grantExpired`, `.refused`…
    public func openDescriptor(forWriting: Bool = false, subpath: String = "") throws -> FileDescriptor {
        if !forWriting, subpath.isEmpty,
            let ready = prefetched.withLock({ fd -> FileDescriptor? in
                defer { fd = nil }; return fd
            })
        {
            return ready
        }
        let (_, descriptor) = try request(.open, withDescriptor: true) { w in
            w.u8(forWriting ? 1 : 0)
            SharingProtocol.string(&w, subpath)
        }
        guard let descriptor else { throw SharingError.brokerUnavailable }
        return descriptor
    }

    /// Sends a request on the access channel; returns the `ok` answer's bytes after the status,
    /// and the descriptor that follows it when `withDescriptor`.
    private func request(
        _ op: SharingProtocol.Op, withDescriptor: Bool = false, _ body: (inout ByteWriter) -> Void
    ) throws -> ([UInt8], FileDescriptor?) {
        try channel.withLock { current in
            guard current != nil else { throw SharingError.accessNotStarted(id) }
            let frame = SharingProtocol.request(op) { w in
                SharingProtocol.uuid(&w, id)
                body(&w)
            }
            guard (try? IPCFrame.write(current!.fd.rawValue, frame)) != nil, let answer = try? current!.reader.frame(),
                answer.count >= 2
            else {
                throw SharingError.brokerUnavailable
            }
            if answer[1] != SharingProtocol.Status.ok.rawValue, let error = try SharingProtocol.outcome(answer) {
                throw error
            }
            guard withDescriptor else { return (Array(answer.dropFirst(2)), nil) }
            guard let descriptor = try? current!.reader.descriptor() else {
                throw SharingError.brokerUnavailable
            }
            return (Array(answer.dropFirst(2)), FileDescriptor(rawValue: descriptor))
        }
    }

    /// The entries of a granted directory (or of `subpath` below it); needs `.contentEnumerating`.
    public func contentsOfDirectory(subpath: String = "") throws -> [GrantedEntry] {
        let (plist, _) = try request(.enumerate) { SharingProtocol.string(&$0, subpath) }
        return try PropertyListDecoder().decode([GrantedEntry].self, from: Data(plist))
    }

    /// Adds a protected file with `data` at `subpath` below a granted directory (never replacing
    /// one); needs `.addingSubItems`. The class is the provider's directory's.
    public func createFile(_ subpath: String, contents data: Data) async throws {
        let (answer, descriptor) = try request(.create, withDescriptor: true) { SharingProtocol.string(&$0, subpath) }
        guard let descriptor, answer.count == 1, let cls = ProtectionClass(rawValue: answer[0]) else {
            throw SharingError.brokerUnavailable
        }
        defer { try? descriptor.close() }
        try await Self.fill(
            try await app.files.createFile(in: descriptor, url: url.appendingPathComponent(subpath), protection: cls),
            with: data)
    }

    /// Writes `data` as the whole content through `handle`, flushes and closes it.
    private static func fill(_ handle: ProtectedFileHandle, with data: Data) async throws {
        do {
            try await handle.truncate(atOffset: 0)
            try await handle.write(data, at: 0)
            try await handle.synchronize()
            try await handle.close()
        } catch {
            try? await handle.close()
            throw error
        }
    }

    /// Renames the item (or `subpath` below a granted directory) within its directory; needs
    /// `.renaming`. Never replaces an existing item.
    public func rename(to newName: String, subpath: String = "") throws {
        _ = try request(.rename) { w in
            SharingProtocol.string(&w, subpath)
            SharingProtocol.string(&w, newName)
        }
    }

    /// Deletes the item (or `subpath` below a granted directory); needs `.deleting`.
    public func remove(subpath: String = "") throws {
        _ = try request(.delete) { SharingProtocol.string(&$0, subpath) }
    }

    /// The item's content (decrypted when it is protected, with this app's keys).
    public func contents(subpath: String = "") async throws -> Data {
        let fd = try openDescriptor(subpath: subpath)
        defer { try? fd.close() }
        do {
            let handle = try await app.files.openHandle(forReadingFrom: fd, url: url)
            defer { Task { try? await handle.close() } }
            return try await handle.readToEnd()
        } catch ProtectedFileError.notProtected {
            return try readPlain(fd)
        }
    }

    /// Replaces the item's content in place, through a read-write descriptor (needs `.writing`;
    /// a read-only grant fails here with `.notGranted`, and a read-only descriptor with `EBADF`).
    public func write(_ data: Data, subpath: String = "") async throws {
        let fd = try openDescriptor(forWriting: true, subpath: subpath)
        defer { try? fd.close() }
        try await Self.fill(try await app.files.openHandle(forUpdating: fd, url: url), with: data)
    }

    private func readPlain(_ fd: FileDescriptor) throws -> Data {
        var result = Data()
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var offset: Int64 = 0
        while true {
            let n = try buffer.withUnsafeMutableBytes { try fd.read(fromAbsoluteOffset: offset, into: $0) }
            if n == 0 { return result }
            result.append(contentsOf: buffer[..<n])
            offset += Int64(n)
        }
    }
}

/// What a bookmark holds (FORMAT.md §11.5): the grant, by ID. Forging one gains nothing: the
/// broker resolves only grants made to the app that asks.
struct BookmarkRecord: Codable {
    var version = 1
    var grant: UUID
    var location: String
    enum CodingKeys: String, CodingKey { case version = "Version", grant = "Grant", location = "Location" }
}

extension SecurityScopedURL {
    /// Bookmark data for a persistent grant, to keep (in the container) and resolve after a
    /// restart with ``CurrentApp/resolveBookmark(_:bookmarkDataIsStale:)`` — `bookmarkData(options:)`'s analogue.
    public func bookmarkData() throws -> Data {
        Data(try binaryPropertyList(BookmarkRecord(grant: id, location: url.path)))
    }
}

extension CurrentApp {
    /// The granted item a bookmark names, as `URL(resolvingBookmarkData:options:relativeTo:bookmarkDataIsStale:)`
    /// does: `isStale` is set when the item moved (make and keep a new bookmark).
    /// - Throws: ``SharingError``: the grant was revoked, expired, was never this app's, or its item is gone.
    public func resolveBookmark(_ data: Data, bookmarkDataIsStale isStale: inout Bool) async throws -> SecurityScopedURL
    {
        guard let record = try? PropertyListDecoder().decode(BookmarkRecord.self, from: data), record.version == 1
        else {
            throw SharingError.refused("this is not bookmark data")
        }
        let answer = try await ask(
            SharingProtocol.request(.resolve) { SharingProtocol.uuid(&$0, record.grant) }, timeout: 30)
        guard answer.count > 1 else { throw SharingError.brokerUnavailable }
        let granted = try PropertyListDecoder().decode(GrantedItemRecord.self, from: Data(answer.dropFirst()))
        let (stale, item) = (answer[0] == 1, SecurityScopedURL(granted, app: self))
        isStale = stale
        return item
    }

    /// The items other apps granted this one (not expired), oldest first.
    public func grantedItems() async throws -> [SecurityScopedURL] {
        let answer = try await ask(SharingProtocol.request(.list), timeout: 30)
        return try PropertyListDecoder().decode([GrantedItemRecord].self, from: Data(answer)).map {
            SecurityScopedURL($0, app: self)
        }
    }
}
