import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// This process's file presenters, and the watcher that tells them of changes recorded in their
/// items' coordination directories (inotify on each directory in use).
final class PresenterRegistry: Sendable {
    static let shared = PresenterRegistry()

    private struct Entry {
        weak var presenter: (any FilePresenter)?
        let token: String
    }
    private struct State {
        var entries: [ObjectIdentifier: Entry] = [:]
        var watched: [Int32: String] = [:]   // inotify watch → directory
        var lastRecord: [String: String] = [:]   // record path → last content delivered
        var inotify: Int32 = -1
    }
    private let state = Mutex(State())

    /// A stable token for `presenter` (coordinators created with it record it as the origin).
    func token(for presenter: any FilePresenter) -> String {
        state.withLock { state in
            if let entry = state.entries[ObjectIdentifier(presenter)] { return entry.token }
            return "presenter-\(getpid())-\(UInt(bitPattern: ObjectIdentifier(presenter).hashValue))"
        }
    }

    func add(_ presenter: any FilePresenter) {
        let token = token(for: presenter)
        let directory = presenter.presentedItemURL.map {
            CoordinationLock.coordinationDirectory(for: $0.standardizedFileURL)
        }
        state.withLock { state in
            state.entries[ObjectIdentifier(presenter)] = Entry(presenter: presenter, token: token)
            if state.inotify < 0 {
                state.inotify = inotify_init1(Int32(IN_CLOEXEC))
                let fd = state.inotify
                let thread = Thread { [self] in watch(fd) }
                thread.name = "file presenters"
                thread.start()
            }
            if let directory, !state.watched.values.contains(directory) {
                try? makeDirectory(directory)
                let watch = inotify_add_watch(state.inotify, directory, UInt32(IN_MOVED_TO | IN_CLOSE_WRITE))
                if watch >= 0 { state.watched[watch] = directory }
            }
        }
    }

    func remove(_ presenter: any FilePresenter) {
        state.withLock { _ = $0.entries.removeValue(forKey: ObjectIdentifier(presenter)) }
    }

    func all() -> [any FilePresenter] { state.withLock { $0.entries.values.compactMap(\.presenter) } }

    /// A record this process just wrote: its presenters hear now, without waiting for inotify.
    func deliverLocally(_ record: String) { deliver(record) }

    private func watch(_ fd: Int32) {
        var buffer = [UInt8](repeating: 0, count: 16384)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return }
            for event in inotifyEvents(buffer, count: n) where event.name.hasSuffix(".change") {
                guard let directory = state.withLock({ $0.watched[event.watch] }) else { continue }
                deliver(directory + "/" + event.name)
            }
        }
    }

    /// Reads a change record and calls the presenters of its item (but the one it came from).
    private func deliver(_ record: String) {
        guard let data = FileManager.default.contents(atPath: record) else { return }
        let text = String(decoding: data, as: UTF8.self)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard lines.count >= 4 else { return }
        let (kind, origin, path) = (lines[0], lines[1], lines[3])
        let targets: [any FilePresenter] = state.withLock { state in
            // The same record seen twice (delivered here, then by inotify): once is enough.
            guard state.lastRecord[record] != text else { return [] }
            state.lastRecord[record] = text
            return state.entries.values.compactMap { entry in
                guard entry.token != origin, let presenter = entry.presenter,
                    presenter.presentedItemURL?.standardizedFileURL.path == path
                else { return nil }
                return presenter
            }
        }
        for presenter in targets {
            switch kind {
            case "changed": presenter.presentedItemDidChange()
            case "deleted": presenter.presentedItemWasDeleted()
            case "moved" where lines.count >= 5: presenter.presentedItemDidMove(to: URL(fileURLWithPath: lines[4]))
            default: break
            }
        }
    }
}
