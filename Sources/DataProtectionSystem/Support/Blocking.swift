import Foundation

/// The result of async work, handed from a task to the thread waiting for it.
/// `@unchecked Sendable`: written once by the task before `finish()`, read by the waiting thread after `drain()`
/// returns (the executor's condition orders the two).
private final class Outcome<T: Sendable>: @unchecked Sendable {
    var result: Result<T, any Error>?
}

/// Runs async work from a plain thread — a server's connection thread, a worker — and waits for
/// its result. Never call it from a task: it blocks the thread it runs on.
///
/// The work runs on the calling thread itself wherever it can (its task prefers a
/// ``CallerThreadExecutor`` that this thread drains; default actors run there too): a call that
/// finds its actors free costs no thread switch.
package func runBlocking<T: Sendable>(_ work: @escaping @Sendable () async throws -> T) throws -> T {
    let outcome = Outcome<T>()
    let executor = CallerThreadExecutor()
    Task(executorPreference: executor) {
        do { outcome.result = .success(try await work()) } catch { outcome.result = .failure(error) }
        executor.finish()
    }
    executor.drain()
    return try outcome.result!.get()
}

/// A task executor whose jobs the one thread blocked in ``drain()`` runs, until ``finish()``;
/// a job that comes later goes to the global concurrent executor.
/// `@unchecked Sendable`: `jobs` and `finished` are read and written only under `condition`.
private final class CallerThreadExecutor: TaskExecutor, @unchecked Sendable {
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var finished = false

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        guard !finished else {
            condition.unlock()
            globalConcurrentExecutor.enqueue(job)
            return
        }
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    func finish() {
        condition.lock()
        finished = true
        condition.signal()
        condition.unlock()
    }

    /// Runs jobs as they come until ``finish()``, then every job already queued.
    func drain() {
        while true {
            condition.lock()
            while jobs.isEmpty, !finished { condition.wait() }
            guard !jobs.isEmpty else {
                condition.unlock()
                return
            }
            let job = jobs.removeFirst()
            condition.unlock()
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }
}
