import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Coordinated reading and writing of files shared between processes — the two member apps of
/// an App Group, say (races in App Groups) — in `NSFileCoordinator`'s shape.
///
/// ```swift
/// let coordinator = FileCoordinator(filePresenter: self)
/// try coordinator.coordinate(writingItemAt: shared, options: .forReplacing) { url in
///     try data.write(to: url, options: .atomic)
/// }
/// try coordinator.coordinate(readingItemAt: shared) { url in note = try String(contentsOf: url) }
/// ```
///
/// Readers share, writers exclude — across processes: each item has a lock file (`flock`) in
/// the coordination directory of the container that holds it (FORMAT.md §10.5). When a writer's
/// block returns, registered ``FilePresenter``s of the item, in any process, are told.
public final class FileCoordinator: Sendable {
    /// `NSFileCoordinator.ReadingOptions`.
    public struct ReadingOptions: OptionSet, Sendable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }
        public static let withoutChanges = ReadingOptions(rawValue: 1 << 0)
        public static let resolvesSymbolicLink = ReadingOptions(rawValue: 1 << 1)
        public static let immediatelyAvailableMetadataOnly = ReadingOptions(rawValue: 1 << 2)
        public static let forUploading = ReadingOptions(rawValue: 1 << 3)
    }

    /// `NSFileCoordinator.WritingOptions`.
    public struct WritingOptions: OptionSet, Sendable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }
        public static let forDeleting = WritingOptions(rawValue: 1 << 0)
        public static let forMoving = WritingOptions(rawValue: 1 << 1)
        public static let forMerging = WritingOptions(rawValue: 1 << 2)
        public static let forReplacing = WritingOptions(rawValue: 1 << 3)
        public static let contentIndependentMetadataOnly = WritingOptions(rawValue: 1 << 4)
    }

    /// The presenter whose own changes these are (it is not told about them).
    public let filePresenter: (any FilePresenter)?
    private let origin: String

    public init(filePresenter: (any FilePresenter)? = nil) {
        self.filePresenter = filePresenter
        self.origin =
            filePresenter.map { PresenterRegistry.shared.token(for: $0) } ?? "coordinator-" + UUID().uuidString
    }

    // MARK: - Presenters

    /// Registers `presenter` for this process: it hears of coordinated changes to its item.
    public static func addFilePresenter(_ presenter: any FilePresenter) { PresenterRegistry.shared.add(presenter) }
    /// Unregisters `presenter` (balance every ``addFilePresenter(_:)``).
    public static func removeFilePresenter(_ presenter: any FilePresenter) {
        PresenterRegistry.shared.remove(presenter)
    }
    /// The presenters registered in this process.
    public static var filePresenters: [any FilePresenter] { PresenterRegistry.shared.all() }

    // MARK: - Coordinating

    /// Runs `reader` while no coordinated writer of `url` runs (readers share).
    public func coordinate<T>(
        readingItemAt url: URL, options: ReadingOptions = [], byAccessor reader: (URL) throws -> T
    ) throws -> T {
        let item = options.contains(.resolvesSymbolicLink) ? url.resolvingSymlinksInPath() : url
        let lock = try CoordinationLock(item: item, exclusive: false)
        defer { lock.release() }
        return try reader(item)
    }

    /// Runs `writer` while no other coordinated reader or writer of `url` runs, then tells the
    /// item's presenters (changed, or deleted when `writer` removed it).
    public func coordinate<T>(
        writingItemAt url: URL, options: WritingOptions = [], byAccessor writer: (URL) throws -> T
    ) throws -> T {
        let lock = try CoordinationLock(item: url, exclusive: true)
        defer { lock.release() }
        let result = try writer(url)
        announceWrite(to: url, options, lock)
        return result
    }

    /// Reads `readingURL` and writes `writingURL` under one coordination (both locks, taken in
    /// a fixed order, so two coordinators doing the reverse never deadlock).
    public func coordinate<T>(
        readingItemAt readingURL: URL, options readingOptions: ReadingOptions = [],
        writingItemAt writingURL: URL, options writingOptions: WritingOptions = [],
        byAccessor accessor: (URL, URL) throws -> T
    ) throws -> T {
        let reading = try CoordinationLock.path(for: readingURL), writing = try CoordinationLock.path(for: writingURL)
        if reading == writing {
            return try coordinate(writingItemAt: writingURL, options: writingOptions) { try accessor($0, $0) }
        }
        let (first, second) =
            reading < writing ? ((readingURL, false), (writingURL, true)) : ((writingURL, true), (readingURL, false))
        let firstLock = try CoordinationLock(item: first.0, exclusive: first.1)
        defer { firstLock.release() }
        let secondLock = try CoordinationLock(item: second.0, exclusive: second.1)
        defer { secondLock.release() }
        let result = try accessor(readingURL, writingURL)
        (first.1 ? firstLock : secondLock).announce(.changed, origin: origin)
        return result
    }

    /// What a finished write tells the item's presenters: deleted (`.forDeleting`, and the item
    /// is gone), nothing for a move (``item(at:didMoveTo:)`` tells that), else changed.
    private func announceWrite(to url: URL, _ options: WritingOptions, _ lock: CoordinationLock) {
        let gone = !FileManager.default.fileExists(atPath: url.path)
        if gone && options.contains(.forMoving) { return }
        lock.announce(gone && options.contains(.forDeleting) ? .deleted : .changed, origin: origin)
    }

    // MARK: - With async accessors

    /// ``coordinate(readingItemAt:options:byAccessor:)`` for async work (protected files'
    /// `contents(of:)`): the lock is waited for off the task's thread.
    public func coordinate<T: Sendable>(
        readingItemAt url: URL, options: ReadingOptions = [],
        byAccessor reader: (URL) async throws -> T
    ) async throws -> T {
        let item = options.contains(.resolvesSymbolicLink) ? url.resolvingSymlinksInPath() : url
        let lock = try await CoordinationLock.acquire(item: item, exclusive: false)
        defer { lock.release() }
        return try await reader(item)
    }

    /// ``coordinate(writingItemAt:options:byAccessor:)`` for async work (protected files'
    /// `write(_:to:)`): the lock is waited for off the task's thread.
    public func coordinate<T: Sendable>(
        writingItemAt url: URL, options: WritingOptions = [],
        byAccessor writer: (URL) async throws -> T
    ) async throws -> T {
        let lock = try await CoordinationLock.acquire(item: url, exclusive: true)
        defer { lock.release() }
        let result = try await writer(url)
        announceWrite(to: url, options, lock)
        return result
    }

    /// Tells presenters of `oldURL` that the item now lives at `newURL` (call inside a
    /// coordinated write with `.forMoving`, after moving it).
    public func item(at oldURL: URL, didMoveTo newURL: URL) {
        guard let lock = try? CoordinationLock(item: oldURL, exclusive: false, announcingOnly: true) else { return }
        lock.announce(.moved(to: newURL), origin: origin)
    }
}
