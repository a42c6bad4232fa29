import Crypto
import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Where a running app's supervisor listens for the user's commands (the home button, status,
/// stop): one socket per run, in keybagd's 0700 runtime directory (FORMAT.md §12.3):
///
///     $XDG_RUNTIME_DIR/dataprotection/app-<12 hex naming the root and the container>-<8 hex of the run>.sock
///
/// Only processes of this user are answered (`SO_PEERCRED`); one request per connection.
enum LifecycleControlSocket {
    /// `app-<12 hex>-`: the first 6 bytes of SHA-256 of the root's digest (§8), a `/` and the
    /// container's UUID — short, so the path fits `sun_path` under a deep `XDG_RUNTIME_DIR`.
    static func prefix(root: String, container: UUID) -> String {
        let digest = SHA256.hash(data: Data((KeybagSocket.rootDigest(root) + "/" + container.uuidString).utf8))
        return "app-" + digest.prefix(6).map { String(format: "%02x", $0) }.joined() + "-"
    }

    static func path(root: String, run: RunningApp) -> String {
        let tag = run.id.uuidString.replacingOccurrences(of: "-", with: "").lowercased().prefix(8)
        return KeybagSocket.directory() + "/" + prefix(root: root, container: run.app.uuid) + tag + ".sock"
    }

    /// The sockets of every running instance of the app with container `container`; stale ones
    /// (nothing answers) are removed.
    static func sockets(root: String, container: UUID) -> [String] {
        let directory = KeybagSocket.directory()
        // Another user's directory (made first in /tmp) is never listed or connected to.
        guard UnixSocket.distrustedDirectory(directory) == nil else { return [] }
        let prefix = prefix(root: root, container: container)
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter {
            $0.hasPrefix(prefix) && $0.hasSuffix(".sock")
        }
        return names.sorted().map { directory + "/" + $0 }
    }

    /// Sends one request to every running instance; their answers, in socket order.
    /// - Throws: ``LifecycleError/notRunning(_:)`` when no instance answers.
    static func send(_ request: [UInt8], root: String, app: AppContainer) throws -> [[UInt8]] {
        var answers: [[UInt8]] = []
        for path in sockets(root: root, container: app.uuid) {
            guard let fd = try? UnixSocket.connectTrusted(path, timeout: 5) else {
                // its supervisor is gone
                if UnixSocket.distrustedDirectory((path as NSString).deletingLastPathComponent) == nil { unlink(path) }
                continue
            }
            defer { close(fd) }
            guard (try? IPCFrame.write(fd, request)) != nil, let answer = try? IPCFrame.read(fd) else { continue }
            answers.append(answer)
        }
        guard !answers.isEmpty else { throw LifecycleError.notRunning(app.identifier.rawValue) }
        return answers
    }

    /// Listens for `controller`'s run until ``ControlServer/stop()``.
    static func serve(_ controller: LifecycleController, root: String, logger: Logger) -> ControlServer? {
        let path = path(root: root, run: controller.run)
        do {
            let listener = try UnixSocket.listen(on: path, backlog: 16)
            let server = ControlServer(listener: listener, path: path)
            let thread = Thread { server.acceptLoop(controller, logger: logger) }
            thread.name = "app control"
            thread.start()
            return server
        } catch {
            logger.notice("\(controller.identifier) cannot be reached by dpctl app background/foreground: \(error)")
            return nil
        }
    }

    final class ControlServer: Sendable {
        let listener: Int32
        let path: String

        init(listener: Int32, path: String) {
            self.listener = listener
            self.path = path
        }

        func stop() {
            unlink(path)
            shutdown(listener, Int32(SHUT_RDWR))
        }

        fileprivate func acceptLoop(_ controller: LifecycleController, logger: Logger) {
            defer { close(listener) }
            while true {
                let client: Int32
                do throws(Errno) { client = try SystemCall.accept4CloseOnExec(listener) } catch {
                    if error == .interrupted || error == .connectionAbort { continue }
                    return   // shut down
                }
                UnixSocket.setTimeouts(client, seconds: 5)
                guard let peer = UnixSocket.peerCredentials(client), peer.uid == getuid() else {
                    close(client)
                    continue
                }
                let thread = Thread {
                    defer { close(client) }
                    guard let request = try? IPCFrame.read(client) else { return }
                    _ = try? IPCFrame.write(client, Self.answer(request, controller))
                }
                thread.start()
            }
        }

        private static func answer(_ request: [UInt8], _ controller: LifecycleController) -> [UInt8] {
            guard request.count >= 2, request[0] == LifecycleProtocol.version,
                let op = LifecycleProtocol.ControlOp(rawValue: request[1]),
                request.count == 2 || (op == .terminate && request.count == 10)
            else {
                return LifecycleProtocol.failure("unknown request")
            }
            do {
                switch op {
                case .background:
                    return LifecycleProtocol.ok + [controller.moveToBackground().rawValue]
                case .foreground:
                    return LifecycleProtocol.ok + [try controller.moveToForeground().rawValue]
                case .status:
                    return LifecycleProtocol.ok + (try AppLifecycleStatus(controller).binaryPropertyList())
                case .terminate:
                    var body = ByteReader(Array(request[2...]))
                    let grace = request.count == 10 ? try LifecycleProtocol.double(&body, "grace") : nil
                    guard
                        grace.map({ $0.isFinite && $0 >= 0 && $0 <= LifecycleSettings.longestTerminationDeadline })
                            ?? true
                    else {
                        return LifecycleProtocol.failure(
                            "a grace period must be between 0 and \(Int(LifecycleSettings.longestTerminationDeadline)) seconds"
                        )
                    }
                    controller.terminate(grace: grace)
                    return LifecycleProtocol.ok
                }
            } catch {
                return LifecycleProtocol.failure(String(describing: error))
            }
        }
    }
}
