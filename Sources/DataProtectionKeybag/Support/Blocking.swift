import Foundation

/// The result of async work, handed from a task to the thread waiting for it.
private final class Outcome<T: Sendable>: @unchecked Sendable {
    var result: Result<T, any Error>?
}

/// Runs async work from a plain thread — a server's connection thread, a worker — and waits for
/// its result. Never call it from a task: it blocks the thread it runs on.
package func runBlocking<T: Sendable>(_ work: @escaping @Sendable () async throws -> T) throws -> T {
    let outcome = Outcome<T>()
    let done = DispatchSemaphore(value: 0)
    Task {
        do { outcome.result = .success(try await work()) } catch { outcome.result = .failure(error) }
        done.signal()
    }
    done.wait()
    return try outcome.result!.get()
}
