import ArgumentParser
import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionLifecycle
import DataProtectionSQLite
import DataProtectionSystem
import Foundation
import Logging
import Synchronization

// Long operations that Ctrl-C and SIGTERM stop where it is safe.

/// Runs `body` in a task that Ctrl-C (SIGINT) and SIGTERM cancel instead of killing the process,
/// so that a long operation can stop where it is safe and say how far it got (the library throws
/// its own "interrupted" error). The signals' default handling is back once `body` ends.
func runInterruptibly<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let task = Task { try await body() }
    let sources = [SIGINT, SIGTERM].map { number -> DispatchSourceSignal in
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler { task.cancel() }
        source.resume()
        return source
    }
    defer {
        for source in sources { source.cancel() }
        for number in [SIGINT, SIGTERM] { signal(number, SIG_DFL) }
    }
    return try await task.value
}
