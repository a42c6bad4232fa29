import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The file handles given to the kernel: an open file (its node) or an open directory.
final class HandleTable: Sendable {
    enum Handle {
        case file(FileNode, writable: Bool)
        case directory(DirectoryHandle)
    }
    private let state = Mutex<(handles: [UInt64: Handle], next: UInt64)>(([:], 1))

    func add(_ handle: Handle) -> UInt64 {
        state.withLock { state in
            let id = state.next
            state.next += 1
            state.handles[id] = handle
            return id
        }
    }

    func file(_ id: UInt64) throws(Errno) -> (FileNode, Bool) {
        guard case .file(let node, let writable)? = state.withLock({ $0.handles[id] }) else {
            throw Errno(rawValue: EBADF)
        }
        return (node, writable)
    }

    func directory(_ id: UInt64) throws(Errno) -> DirectoryHandle {
        guard case .directory(let handle)? = state.withLock({ $0.handles[id] }) else { throw Errno(rawValue: EBADF) }
        return handle
    }

    @discardableResult
    func remove(_ id: UInt64) -> Handle? { state.withLock { $0.handles.removeValue(forKey: id) } }
}

/// An open directory. It holds no descriptor: each READDIR opens the directory again and reads
/// it with `getdents64` from the offset the kernel asks (one READDIR of a handle at a time).
final class DirectoryHandle: Sendable {
    let lock = Mutex(())
}
