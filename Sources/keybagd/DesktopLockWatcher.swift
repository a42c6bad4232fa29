import Foundation
import Logging
import Synchronization

/// Watches the desktop's lock signals with `gdbus monitor`, which only shows signals sent by the
/// current owner of the watched name — a process that merely claims to be the screensaver or
/// logind is not heard:
///
/// - session bus, `org.freedesktop.ScreenSaver`: `ActiveChanged(b)`;
/// - system bus, `org.freedesktop.login1`: a session's `LockedHint` (`PropertiesChanged`) and the
///   manager's `PrepareForSleep(b)`.
///
/// A bus that does not exist here (no session bus address, no system bus socket, no `gdbus`) is
/// reported once; the daemon then works with explicit locks only.
final class DesktopLockWatcher: Sendable {
    enum Signal: Equatable, Sendable {
        case screenSaverActive(Bool)
        case sessionLocked(Bool)
        case prepareForSleep(Bool)
    }

    private let logger = Logger(label: "keybagd.desktop")
    private let processes = Mutex<[Process]>([])

    /// Parses one line of `gdbus monitor` output.
    static func parse(_ line: String) -> Signal? {
        func flag(_ text: Substring) -> Bool? {
            text.contains("true") ? true : text.contains("false") ? false : nil
        }
        if let range = line.range(of: "org.freedesktop.ScreenSaver.ActiveChanged ") {
            return flag(line[range.upperBound...]).map(Signal.screenSaverActive)
        }
        if line.contains(": org.freedesktop.DBus.Properties.PropertiesChanged ("),
            line.contains("/org/freedesktop/login1/session/"),
            let range = line.range(of: "'LockedHint': <")
        {
            return flag(line[range.upperBound...].prefix(6)).map(Signal.sessionLocked)
        }
        if let range = line.range(of: "org.freedesktop.login1.Manager.PrepareForSleep ") {
            return flag(line[range.upperBound...]).map(Signal.prepareForSleep)
        }
        return nil
    }

    /// Starts a monitor on each bus that exists; returns once each is listening (or failed).
    func start(_ onSignal: @escaping @Sendable (Signal) -> Void) {
        let environment = ProcessInfo.processInfo.environment
        guard let gdbus = Self.findExecutable("gdbus") else {
            logger.notice(
                "gdbus (libglib2.0-bin) is not installed: desktop lock and suspend are not watched; lock with `dpctl lock`"
            )
            return
        }
        var watched: [String] = []
        if Self.sessionBusExists(environment) {
            if monitor(gdbus, ["--session", "--dest", "org.freedesktop.ScreenSaver"], onSignal) {
                watched.append("the screensaver (session bus)")
            }
        } else {
            logger.notice("no D-Bus session bus here: the screensaver's lock is not watched")
        }
        if Self.systemBusExists(environment) {
            if monitor(gdbus, ["--system", "--dest", "org.freedesktop.login1"], onSignal) {
                watched.append("logind's session lock and suspend (system bus)")
            }
        } else {
            logger.notice("no D-Bus system bus here: logind's session lock and suspend are not watched")
        }
        if watched.isEmpty {
            logger.notice("no desktop lock signals to watch: lock with `dpctl lock`")
        } else {
            logger.info("watching \(watched.joined(separator: " and "))")
        }
    }

    func stop() {
        for process in processes.withLock({ $0 }) where process.isRunning { process.terminate() }
    }

    private func monitor(
        _ gdbus: String, _ arguments: [String], _ onSignal: @escaping @Sendable (Signal) -> Void
    ) -> Bool {
        let process = Process()
        if let setpriv = Self.findExecutable("setpriv") {
            // The monitor dies with the daemon, even when the daemon is killed outright.
            process.executableURL = URL(fileURLWithPath: setpriv)
            process.arguments = ["--pdeathsig", "KILL", gdbus, "monitor"] + arguments
        } else {
            process.executableURL = URL(fileURLWithPath: gdbus)
            process.arguments = ["monitor"] + arguments
        }
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch {
            logger.notice("cannot run gdbus monitor \(arguments.joined(separator: " ")): \(error)")
            return false
        }
        defer {
            if !process.isRunning {
                logger.notice("gdbus monitor \(arguments.joined(separator: " ")) did not start listening")
            }
        }
        processes.withLock { $0.append(process) }
        let listening = DispatchSemaphore(value: 0)
        let logger = self.logger
        let thread = Thread {
            let handle = output.fileHandleForReading
            var buffer = Data()
            var signalled = false
            while case let chunk = handle.availableData, !chunk.isEmpty {   // whatever gdbus wrote; empty at its end
                buffer += chunk
                while let newline = buffer.firstIndex(of: 0x0A) {
                    let line = String(decoding: buffer[buffer.startIndex..<newline], as: UTF8.self)
                    buffer.removeSubrange(buffer.startIndex...newline)
                    if !signalled { signalled = true; listening.signal() }
                    if let signal = Self.parse(line) { onSignal(signal) }
                }
            }
            if !signalled { listening.signal() }
            logger.notice("stopped watching \(arguments[0].dropFirst(2)) bus (gdbus monitor ended)")
        }
        thread.name = "keybagd desktop"
        thread.start()
        // gdbus prints a first line once its match rule is in place.
        return listening.wait(timeout: .now() + 5) == .success && process.isRunning
    }

    static func sessionBusExists(_ environment: [String: String]) -> Bool {
        if let address = environment["DBUS_SESSION_BUS_ADDRESS"], !address.isEmpty { return addressReachable(address) }
        if let runtime = environment["XDG_RUNTIME_DIR"] {
            return FileManager.default.fileExists(atPath: runtime + "/bus")
        }
        return false
    }

    static func systemBusExists(_ environment: [String: String]) -> Bool {
        if let address = environment["DBUS_SYSTEM_BUS_ADDRESS"], !address.isEmpty { return addressReachable(address) }
        return FileManager.default.fileExists(atPath: "/run/dbus/system_bus_socket")
    }

    /// A `unix:path=` address whose socket exists (other transports are assumed reachable).
    static func addressReachable(_ address: String) -> Bool {
        guard let range = address.range(of: "unix:path=") else { return true }
        let path = address[range.upperBound...].prefix { $0 != "," && $0 != ";" }
        return FileManager.default.fileExists(atPath: String(path))
    }

    static func findExecutable(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for directory in path.split(separator: ":")
        where FileManager.default.isExecutableFile(atPath: "\(directory)/\(name)") {
            return "\(directory)/\(name)"
        }
        return nil
    }
}
