import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The supervisor's clock, seen from its app: the time deadlines are counted on, and sleeps
/// that end when that clock gets there — real time normally, a virtual clock in tests and
/// examples (so an app's "one item per second" follows the test's clock, not the wall's).
final class SupervisorClock: KeybagClock {
    private let app: CurrentApp
    /// The clock's own channel for `now` (sleeps take one each).
    private let requests: LifecycleRequests

    init(app: CurrentApp) {
        self.app = app
        requests = LifecycleRequests(app: app)
    }

    func now() -> Date {
        guard var body = requests.ask(LifecycleProtocol.request(LifecycleProtocol.Op.now.rawValue)),
            let seconds = try? LifecycleProtocol.double(&body, "now")
        else { return Date() }
        return Date(timeIntervalSince1970: seconds)
    }

    /// Sleeps on a channel of its own (the supervisor answers when its clock reaches
    /// `deadline`); cancelling closes the channel.
    func sleep(until deadline: Date) async throws {
        guard let fd = app.openServiceChannel(LifecycleProtocol.serviceIdentifier)?.rawValue else {
            let seconds = deadline.timeIntervalSinceNow
            if seconds > 0 { try await Task.sleep(for: .milliseconds(Int64(seconds * 1000))) }
            return
        }
        UnixSocket.setTimeouts(fd, seconds: 0)
        let request = LifecycleProtocol.request(LifecycleProtocol.Op.sleepUntil.rawValue) {
            LifecycleProtocol.double(&$0, deadline.timeIntervalSince1970)
        }
        try await withTaskCancellationHandler {
            let answered = await Task.detached { () -> Bool in
                defer { close(fd) }
                guard (try? IPCFrame.write(fd, request)) != nil, let answer = try? IPCFrame.read(fd) else {
                    return false
                }
                return (try? LifecycleProtocol.body(answer)) != nil
            }.value
            try Task.checkCancellation()
            if !answered { throw LifecycleError.supervisorUnavailable }
        } onCancel: {
            shutdown(fd, Int32(SHUT_RDWR))
        }
    }
}
