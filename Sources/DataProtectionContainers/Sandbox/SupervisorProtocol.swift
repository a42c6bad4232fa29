import DataProtectionIPC
import DataProtectionKeybag
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The app's one channel out of its sandbox (FORMAT.md §10.3): a connected Unix socket it
/// inherits as descriptor 3 (`DATAPROTECTION_SUPERVISOR_FD`). The supervisor at the other end
/// knows which app this is — the app cannot say otherwise — and answers:
///
/// - `describe` (op 1): the app's identity and places, as a property list;
/// - `keybag channel` (op 2): a new connected socket, passed as a descriptor, on which the
///   supervisor speaks keybagd's protocol (§8) for the operations an app may use
///   (``Keybag/appOperations``; anything else is answered `notPermitted`);
/// - `service channel` (op 3, one byte naming the service): a new connected socket served by
///   the ``AppSupervisorService`` with that identifier (sharing: 1), refused when there is none.
enum SupervisorProtocol {
    static let version: UInt8 = 1
    enum Op: UInt8 { case describe = 1, keybagChannel = 2, serviceChannel = 3 }
    /// The byte sent with a channel's descriptor; `refused` comes alone.
    static let channelGranted: UInt8 = 0
    static let channelRefused: UInt8 = 1
    /// The environment variables the supervisor sets.
    static let descriptorVariable = "DATAPROTECTION_SUPERVISOR_FD"
    static let appVariable = "DATAPROTECTION_APP_ID"
    static let containerVariable = "DATAPROTECTION_CONTAINER"
    /// The app's App Group containers for programs without the Swift API: one `GROUP-ID=PATH`
    /// line per group, sorted by identifier (absent for an app in no group).
    static let groupContainersVariable = "DATAPROTECTION_GROUP_CONTAINERS"
}

/// What the supervisor tells its app about itself (`describe`).
struct AppDescription: Codable, Sendable, Equatable {
    var identifier: String
    var container: String
    /// Group identifier → its container's path.
    var groups: [String: String]
    /// Whether the app runs in the sandbox (`false` only with `--no-sandbox`).
    var sandboxed: Bool
    /// Whether the protected file system serves the app's containers (then the app reads and
    /// writes plaintext, and gets no file key: §10.6). Absent in older supervisors: `false`.
    var servedByFileSystem: Bool = false

    enum CodingKeys: String, CodingKey {
        case identifier = "Identifier", container = "Container", groups = "Groups", sandboxed = "Sandboxed",
            servedByFileSystem = "ServedByFileSystem"
    }

    init(
        identifier: String, container: String, groups: [String: String], sandboxed: Bool,
        servedByFileSystem: Bool = false
    ) {
        self.identifier = identifier
        self.container = container
        self.groups = groups
        self.sandboxed = sandboxed
        self.servedByFileSystem = servedByFileSystem
    }

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        identifier = try container.decode(String.self, forKey: .identifier)
        self.container = try container.decode(String.self, forKey: .container)
        groups = try container.decode([String: String].self, forKey: .groups)
        sandboxed = try container.decode(Bool.self, forKey: .sandboxed)
        servedByFileSystem = try container.decodeIfPresent(Bool.self, forKey: .servedByFileSystem) ?? false
    }
}

/// The app's end of the supervisor socket.
final class SupervisorConnection: Sendable {
    let fd: Int32
    /// One request at a time on the socket (its answers come in order).
    private let exchange = Mutex(())

    init(fd: Int32) { self.fd = fd }

    func describe() throws -> AppDescription {
        try exchange.withLock { _ in
            try IPCFrame.write(fd, [SupervisorProtocol.version, SupervisorProtocol.Op.describe.rawValue])
            guard let reply = try IPCFrame.read(fd), reply.count > 2, reply[0] == SupervisorProtocol.version,
                reply[1] == 0
            else {
                throw IPCError("the supervisor did not describe the app")
            }
            return try PropertyListDecoder().decode(AppDescription.self, from: Data(reply[2...]))
        }
    }

    /// A new keybag channel, or `nil` (the supervisor refused or is gone).
    func openKeybagChannel() -> Int32? {
        openChannel([SupervisorProtocol.version, SupervisorProtocol.Op.keybagChannel.rawValue])
    }

    /// A new channel to the supervisor's service `identifier`, or `nil` (no such service, too
    /// many channels, or the supervisor is gone).
    func openServiceChannel(_ identifier: UInt8) -> Int32? {
        openChannel([SupervisorProtocol.version, SupervisorProtocol.Op.serviceChannel.rawValue, identifier])
    }

    private func openChannel(_ request: [UInt8]) -> Int32? {
        exchange.withLock { _ -> Int32? in
            guard (try? IPCFrame.write(fd, request)) != nil,
                let answer = try? UnixSocket.receiveDescriptor(from: fd, capacity: 1)
            else { return nil }
            guard answer.message == [SupervisorProtocol.channelGranted], let channel = answer.descriptor else {
                if let stray = answer.descriptor { close(stray) }
                return nil
            }
            UnixSocket.setTimeouts(channel, seconds: 30)
            return channel
        }
    }
}
