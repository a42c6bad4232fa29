import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Who sent the request a serving thread is answering: the process ID the kernel put in the
/// request's header, kept per thread while the request is handled, and the PID namespace it
/// belongs to — an app's, since every sandbox has one of its own (and may not make more: no user
/// namespace is left to it), or the host's for every program outside a sandbox.
enum Requester {
    /// One per serving thread, never freed (threads live as long as the mount).
    private final class Current {
        var pid: UInt32 = 0
        var namespace: UInt64?
    }

    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key, nil)
        return key
    }()

    private static var current: Current {
        if let value = pthread_getspecific(key) { return Unmanaged<Current>.fromOpaque(value).takeUnretainedValue() }
        let made = Current()
        pthread_setspecific(key, Unmanaged.passRetained(made).toOpaque())
        return made
    }

    /// Records the process whose request this thread now handles (0: none, or the kernel's own).
    static func begin(pid: UInt32) {
        let current = current
        current.pid = pid
        current.namespace = nil
    }

    /// The PID namespace (its inode number) of the process whose request this thread handles,
    /// read once per request; 0 when it cannot be told (no process, or one gone since).
    static var namespace: UInt64 {
        let current = current
        if let known = current.namespace { return known }
        let found = namespace(of: current.pid)
        current.namespace = found
        return found
    }

    /// A descriptor of the requesting process's PID namespace, if it is still `namespace`: held,
    /// it keeps the namespace's inode number from going to another while its owner is charged
    /// (``NodeTable``). -1 when the process is gone or now in another.
    static func pin(_ namespace: UInt64) -> Int32 {
        let pid = current.pid
        guard pid != 0, namespace != 0 else { return -1 }
        let fd = open("/proc/\(pid)/ns/pid", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return -1 }
        var st = stat()
        guard fstat(fd, &st) == 0, UInt64(st.st_ino) == namespace else { close(fd); return -1 }
        return fd
    }

    private static func namespace(of pid: UInt32) -> UInt64 {
        guard pid != 0 else { return 0 }
        var buffer = [CChar](repeating: 0, count: 64)
        let n = readlink("/proc/\(pid)/ns/pid", &buffer, buffer.count - 1)
        guard n > 0 else { return 0 }
        // "pid:[4026531836]"
        let text = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let open = text.firstIndex(of: "["), let close = text.lastIndex(of: "]"), open < close else { return 0 }
        return UInt64(text[text.index(after: open)..<close]) ?? 0
    }
}
