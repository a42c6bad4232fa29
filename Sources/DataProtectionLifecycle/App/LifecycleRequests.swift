import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// One request channel to the app's supervisor (FORMAT.md §12.2), opened on first use and
/// reopened after a failure; one request at a time.
final class LifecycleRequests: Sendable {
    private let app: CurrentApp
    private let channel = Mutex<Int32?>(nil)

    init(app: CurrentApp) { self.app = app }

    /// The `ok` body of the answer to `request`, or `nil` (refused, or no supervisor).
    func ask(_ request: [UInt8]) -> ByteReader? {
        channel.withLock { fd -> ByteReader? in
            if fd == nil { fd = app.openServiceChannel(LifecycleProtocol.serviceIdentifier)?.rawValue }
            guard let open = fd else { return nil }
            guard (try? IPCFrame.write(open, request)) != nil, let answer = try? IPCFrame.read(open),
                let body = try? LifecycleProtocol.body(answer)
            else {
                close(open)
                fd = nil
                return nil
            }
            return body
        }
    }
}
