import DataProtectionContainers
import Foundation
import SystemPackage

/// What one sharing channel remembers between requests (FORMAT.md §11.4): the grants it started
/// access to, the grant a pipelined start just checked, and the providers' container
/// directories it opened items beneath — so the common start-then-open costs one grant check
/// and one `openat2`, not two of each plus an `open` and `close` of the container.
struct GrantAccessSession {
    /// The grants this channel started access to.
    var started = Set<UUID>()
    /// The grant (and its provider) the previous request checked, kept only when the next
    /// request had already arrived with it: start and open sent together are checked as one.
    private(set) var pipelinedCheck: (id: UUID, grant: Grant, provider: AppContainer)?
    /// Providers' container directories, by path (a handful at most; an uninstalled container's
    /// descriptor finds nothing beneath it, and its provider check fails first).
    private var directories: [String: FileDescriptor] = [:]

    /// Records a successful start; `pipelined`: the next request is already read.
    mutating func didStart(_ id: UUID, grant: Grant, provider: AppContainer, pipelined: Bool) {
        started.insert(id)
        pipelinedCheck = pipelined ? (id, grant, provider) : nil
    }

    /// The check a pipelined start left for request `id`, consumed by whichever request comes next.
    mutating func takePipelinedCheck(for id: UUID) -> (grant: Grant, provider: AppContainer)? {
        defer { pipelinedCheck = nil }
        guard let check = pipelinedCheck, check.id == id else { return nil }
        return (check.grant, check.provider)
    }

    /// Forgets a pipelined check (any request but the one it was for).
    mutating func clearPipelinedCheck() { pipelinedCheck = nil }

    /// The directory at `path` (a container's root), opened once per channel.
    mutating func directory(_ path: String) throws -> FileDescriptor {
        if let open = directories[path] { return open }
        let opened = try BeneathOpen.directory(path)
        if directories.count >= 8 { close() }
        directories[path] = opened
        return opened
    }

    /// Closes the directories this session opened.
    mutating func close() {
        for directory in directories.values { try? directory.close() }
        directories.removeAll()
    }
}
