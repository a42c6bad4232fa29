import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Crosses between app sandboxes on the apps' behalf — the part transitd, sharingd and the
/// file-provider machinery play on iOS. It runs outside every sandbox (in each app's supervisor
/// and in `dpctl`), opens what apps can write only with `openat2` beneath their containers, and
/// never trusts a name an app gives.
///
/// ```swift
/// let broker = SharingBroker(manager: manager)
/// let copy = try await broker.openIn("Documents/report.pdf", from: AppIdentifier("com.example.mail"),
///                                    to: AppIdentifier("com.example.viewer"))
/// copy.url        // …/com.example.viewer's container/Documents/Inbox/report.pdf
/// ```
public struct SharingBroker: Sendable {
    public let manager: ContainerManager
    public var files: ProtectedFileManager { manager.files }
    /// The bytes of snapshots one app's shares may hold at once, outside its container
    /// (``share(_:from:with:live:)``): 4 GiB unless set.
    public var snapshotBytesPerApp: Int64 = 4 << 30

    /// Files an app's Inbox may hold before "open in" to it is refused: the app removes what it
    /// has read (as iOS asks of apps), and a sender cannot fill its disk.
    public static let inboxLimit = 1_000

    public init(manager: ContainerManager) {
        self.manager = manager
    }

    /// What an "open in" made.
    public struct OpenInCopy: Sendable, Equatable {
        public let recipient: AppIdentifier
        /// The copy, as the recipient sees it: in its `Documents/Inbox`.
        public let url: URL
        /// The copy's class: the stronger of the source's and the recipient's default.
        public let protection: ProtectionClass
    }

    // MARK: - Open in another app (crossing 1)

    /// Copies the file at `path` in `sender`'s container (or one of its groups' containers;
    /// relative paths are taken from the container's root) into `recipient`'s Inbox, and queues
    /// the news for `recipient` (told now if it is running and listening, else at its next launch).
    ///
    /// The copy is the recipient's alone: a new protected file with its own key, never touched by
    /// the sender's later writes, of the stronger of the source's class and the recipient's
    /// default; its name is made from `displayName` (default: the source's name) by
    /// ``InboxName``, numbered rather than replacing anything.
    ///
    /// - Throws: ``SharingError`` for an item outside the sender's containers, missing, or not a
    ///   single regular file (directories, links, FIFOs, devices are refused, never followed);
    ///   ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)`` when the
    ///   source's class is locked (a class-A file while the device is locked: nothing is copied);
    ///   ``ContainerError/unknownApp(_:)``.
    public func openIn(
        _ path: String, from sender: AppIdentifier, to recipient: AppIdentifier,
        displayName: String? = nil
    ) async throws -> OpenInCopy {
        guard sender != recipient else { throw SharingError.sameApp(sender) }
        let from = try manager.app(sender)
        let to = try manager.app(recipient)
        try manager.layout.prepareSharing()
        let source = try openItem(path, in: from, flags: O_RDONLY | O_NONBLOCK)
        defer { try? source.descriptor.close() }
        try BeneathOpen.requireSingleRegularFile(
            try BeneathOpen.status(source.descriptor, path: source.path), path: source.path)

        let root = try BeneathOpen.directory(to.url.path)
        defer { try? root.close() }
        let inbox = try BeneathOpen.open(
            to.inboxStorage.lastPathComponent, beneath: root, flags: O_RDONLY | O_DIRECTORY,
            path: to.inboxStorage.path)
        defer { try? inbox.close() }
        let queue = DeliveryQueue(layout: manager.layout, app: to.uuid)
        try queue.requireRoom(from: sender, to: recipient)
        if let held = try? POSIXFile.directoryEntries(to.inboxStorage.path).count, held >= Self.inboxLimit {
            throw SharingError.refused(
                "\(recipient)'s Inbox holds \(held) files (at most \(Self.inboxLimit)) until it removes some: nothing was sent"
            )
        }
        let name = InboxName(displayName ?? (source.path as NSString).lastPathComponent)
        let fileName: String, cls: ProtectionClass
        do {
            (fileName, cls) = try await files.copyFile(
                from: source.descriptor, sourceURL: URL(fileURLWithPath: source.path),
                into: inbox, directoryURL: to.inboxStorage,
                protection: to.defaultProtection, names: name.candidate)
        } catch ProtectedFileError.fileSystem(let error) where error.errno == .resourceBusy {
            throw SharingError.refusedItem(path: source.path, reason: "changed size while it was being copied")
        } catch ProtectedFileError.fileSystem(let error) where error.errno == .noSpace {
            throw SharingError.refused(
                "\(recipient) has no room for \(name.candidate(1)) (the disk would be nearly full): nothing was copied")
        }
        try queue.enqueue(Delivery(kind: .openIn, name: fileName, sender: sender.rawValue, date: Date()))
        return OpenInCopy(recipient: recipient, url: to.inbox.appendingPathComponent(fileName), protection: cls)
    }

    // MARK: - Uninstalling

    /// Uninstalls `identifier` (``ContainerManager/uninstall(_:)``) and forgets what the broker
    /// kept for it: its queued deliveries and the grants it gave and received (as Android does).
    public func uninstall(_ identifier: AppIdentifier) async throws {
        let app = try manager.app(identifier)
        try await manager.uninstall(identifier)
        DeliveryQueue(layout: manager.layout, app: app.uuid).removeAll()
        removeGrants(of: app)
    }

    // MARK: - Finding items

    /// Opens `path` beneath the container of `app` (or of one of its groups) it is in.
    /// With `servedPath`, opened where the protected file system serves the container.
    func openItem(
        _ path: String, in app: AppContainer, flags: Int32,
        servedPath: (@Sendable (String) -> String)? = nil
    ) throws -> (descriptor: FileDescriptor, path: String) {
        let (base, relative) = try locate(path, in: app)
        let directory = try BeneathOpen.directory(servedPath?(base) ?? base)
        defer { try? directory.close() }
        let full = relative.isEmpty ? base : base + "/" + relative
        return (try BeneathOpen.open(relative, beneath: directory, flags: flags, path: full), full)
    }

    /// The container `path` is in and the path relative to it. Lexical only: what is found
    /// there is checked by the `openat2` that follows.
    func locate(_ path: String, in app: AppContainer) throws -> (base: String, relative: String) {
        // Compared by bytes (scalars), as the kernel does: `String` equality and `hasPrefix`
        // would match NFC with NFD, and miss a `/` followed by a combining mark.
        let scalars = Array(path.unicodeScalars)
        guard LosslessPath.isAbsolute(path) else { return (app.url.path, Self.trimmed(scalars[...])) }
        let bases = [app.url.path] + app.groups.compactMap { try? manager.group($0).url.path }
        for base in bases {
            let prefix = Array(base.unicodeScalars)
            if scalars == prefix
                || (scalars.starts(with: prefix) && scalars.count > prefix.count && scalars[prefix.count] == "/")
            {
                return (base, Self.trimmed(scalars[prefix.count...]))
            }
        }
        throw SharingError.outsideContainer(path: path, app: app.identifier)
    }

    private static func trimmed(_ relative: ArraySlice<Unicode.Scalar>) -> String {
        var text = relative
        while text.first == "/" { text = text.dropFirst() }
        while text.last == "/" { text = text.dropLast() }
        var out = String.UnicodeScalarView()
        out.append(contentsOf: text)
        return String(out)
    }
}
