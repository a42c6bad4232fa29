import Foundation
import Synchronization

/// What the cipher VFS knows about one encrypted database: its format and page keys, shared by
/// every connection (and its journal and WAL) opened on it from this process.
///
/// The keys can be withdrawn (``seal()``): from then on every read and write of the database's
/// files fails with `SQLITE_IOERR_AUTH`, until ``unseal(_:)`` gives them back. That is how a
/// class-A database stops working when the device locks, without the app reopening it.
final class CipherContext: Sendable {
    let path: String
    let format: SQLCipherFormat
    let token: String

    private struct State {
        var cipher: PageCipher?
        var lastFailure: String?
    }
    private let state: Mutex<State>
    /// Grows on every seal and unseal, so a file can keep its own copy of the cipher and look
    /// at one atomic integer per call instead of taking the lock.
    let generation = Atomic<Int>(0)

    init(path: String, format: SQLCipherFormat, cipher: PageCipher) {
        self.path = path
        self.format = format
        self.token = UUID().uuidString
        self.state = Mutex(State(cipher: cipher))
    }

    /// The page cipher, or `nil` while sealed.
    var cipher: PageCipher? { state.withLock { $0.cipher } }

    var isSealed: Bool { state.withLock { $0.cipher == nil } }

    /// Withdraws the keys (they are dropped from memory here).
    func seal() {
        state.withLock { state in
            state.cipher = nil
            generation.add(1, ordering: .sequentiallyConsistent)
        }
    }

    /// Gives the keys back.
    func unseal(_ cipher: PageCipher) {
        state.withLock { state in
            state.cipher = cipher
            generation.add(1, ordering: .sequentiallyConsistent)
        }
    }

    /// The cipher as of `generation`, for files that cache it.
    func snapshot() -> (generation: Int, cipher: PageCipher?) {
        state.withLock { (generation.load(ordering: .sequentiallyConsistent), $0.cipher) }
    }

    /// Remembers why the last page failed, so errors can name the database and the page.
    func recordFailure(_ message: String) { state.withLock { $0.lastFailure = message } }

    /// The last failure recorded, cleared by reading it.
    func takeFailure() -> String? {
        state.withLock { state in
            defer { state.lastFailure = nil }; return state.lastFailure
        }
    }
}

/// Contexts by token. The VFS finds a database's context through the `dp-context` URI
/// parameter of the file name SQLite opens; the registry holds them weakly, so a context lives
/// exactly as long as the database objects (and open files) that use it.
enum CipherContextRegistry {
    /// `@unchecked Sendable`: a weak reference's loads and stores are atomic, and the table that holds it is a `Mutex`.
    private final class WeakContext: @unchecked Sendable {
        weak var context: CipherContext?
        init(_ context: CipherContext) { self.context = context }
    }
    private static let table = Mutex<[String: WeakContext]>([:])

    static func register(_ context: CipherContext) {
        table.withLock { table in
            table = table.filter { $0.value.context != nil }
            table[context.token] = WeakContext(context)
        }
    }

    static func lookup(_ token: String) -> CipherContext? {
        table.withLock { $0[token]?.context }
    }
}
