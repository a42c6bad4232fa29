@testable import DataProtectionKeybag
import DataProtectionSystem
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import Testing

/// `runBlocking` from plain threads: actor calls run on the calling thread where they can,
/// contended actors and nested tasks still finish, errors come back.
struct BlockingTests {
    actor Counter {
        var value = 0
        func add(_ n: Int) async -> Int {
            value += n
            await Task.yield()
            return value
        }
    }

    struct Failure: Error, Equatable {}

    /// Runs `body` on a thread of its own (as a server's threads call `runBlocking`) and waits.
    func onThread(_ body: @escaping @Sendable () throws -> Void) throws {
        let outcome = Mutex<(any Error)?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread {
            do { try body() } catch { outcome.withLock { $0 = error } }
            done.signal()
        }.start()
        #expect(done.wait(timeout: .now() + 120) == .success)
        if let error = outcome.withLock({ $0 }) { throw error }
    }

    @Test func resultsErrorsAndTheCallingThread() throws { try onThread(Self.resultsErrorsAndTheCallingThread) }

    static func resultsErrorsAndTheCallingThread() throws {
        let counter = Counter()
        let caller = pthread_self()
        let ranHere = Mutex(false)
        #expect(try runBlocking {
            ranHere.withLock { $0 = pthread_equal(pthread_self(), caller) != 0 }
            return await counter.add(2)
        } == 2)
        #expect(ranHere.withLock { $0 })
        #expect(throws: Failure.self) { try runBlocking { () async throws -> Int in throw Failure() } }
        // Child tasks run, and finish, before the result comes back.
        let sum = try runBlocking {
            await withTaskGroup(of: Int.self) { group in
                for n in 1...10 { group.addTask { await counter.add(n) } }
                return await group.reduce(0) { $0 + ($1 > 0 ? 1 : 0) }
            }
        }
        #expect(sum == 10)
    }

    @Test func manyThreadsOnOneActorAllFinish() {
        let counter = Counter()
        let done = DispatchGroup()
        let failures = Mutex(0)
        for _ in 0..<16 {
            done.enter()
            Thread {
                for _ in 0..<500 where (try? runBlocking { await counter.add(1) }) == nil {
                    failures.withLock { $0 += 1 }
                }
                done.leave()
            }.start()
        }
        #expect(done.wait(timeout: .now() + 120) == .success)
        #expect(failures.withLock { $0 } == 0)
        let total = Mutex(0)
        try? onThread { total.withLock { $0 = (try? runBlocking { await counter.add(0) }) ?? -1 } }
        #expect(total.withLock { $0 } == 16 * 500)
    }
}
