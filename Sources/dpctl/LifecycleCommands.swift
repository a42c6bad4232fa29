import ArgumentParser
import DataProtectionContainers
import DataProtectionLifecycle
import Foundation

struct AppBackground: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "background",
        abstract: "Send a running app to the background (home button).",
        discussion: """
            The app hears willResignActive and didEnterBackground. With no background task it \
            is suspended (no CPU at all) a few seconds later; its tasks keep it running up to \
            its budget (dpctl app run --background-time).
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: ArgumentHelp("The app's identifier.", valueName: "id")) var identifier: String

    func run() async throws { try await switchApp(identifier, device) { try $0.moveToBackground($1) } }
}

struct AppForeground: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "foreground",
        abstract: "Bring a running app back to the front.",
        discussion: "The app hears willEnterForeground and didBecomeActive. Refused while the device is locked.")

    @OptionGroup var device: DeviceOptions
    @Argument(help: ArgumentHelp("The app's identifier.", valueName: "id")) var identifier: String

    func run() async throws { try await switchApp(identifier, device) { try $0.moveToForeground($1) } }
}

struct AppState: AsyncParsableCommand {
    /// The JSON form: the status's fields under dpctl's lower-camel keys.
    struct Report: Encodable {
        struct Task: Encodable { var id: UInt32, name: String, started: String }
        var identifier: String, state: String, suspension: String, stoppedByKernel: Bool, pid: Int32?
        var tasks: [Task], backgroundTimeRemaining: Double?, limits: String?

        init(_ status: AppLifecycleStatus) {
            identifier = status.identifier
            state = status.state
            suspension = status.suspension
            stoppedByKernel = status.stoppedByKernel
            pid = status.pid
            tasks = status.tasks.map {
                Task(id: $0.id, name: $0.name, started: ISO8601DateFormatter().string(from: $0.started))
            }
            backgroundTimeRemaining = status.backgroundTimeRemaining
            limits = status.limits
        }
    }

    static let configuration = CommandConfiguration(
        commandName: "state",
        abstract: "Show a running app's state and background tasks.")

    @OptionGroup var device: DeviceOptions
    @Flag(help: "Print JSON.") var json = false
    @Argument(help: ArgumentHelp("The app's identifier.", valueName: "id")) var identifier: String

    func run() async throws {
        let id = try appIdentifier(identifier)
        let statuses = try AppSwitcher(manager: try await containerManager(device)).status(id)
        if json { return printJSON(statuses.map(Report.init)) }
        for status in statuses {
            var line = "\(status.identifier): \(status.state)"
            if let pid = status.pid { line += ", pid \(pid)" }
            if let left = status.backgroundTimeRemaining {
                line += String(format: ", %.0f s of background time left", left)
            }
            line += ", suspended by \(status.suspension)"
            printOut(line)
            if let limits = status.limits { printOut("  limits: \(limits)") }
            for task in status.tasks {
                printOut("  background task \(task.id): \(task.name.isEmpty ? "(unnamed)" : task.name)")
            }
        }
    }
}

struct AppStop: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stop",
        abstract: "Stop a running app (SIGTERM, later SIGKILL).",
        discussion: """
            The same as sending SIGTERM to its `dpctl app run`: every process of the app gets \
            SIGTERM (a shell's trap runs), a Swift app hears willTerminate, and what is left \
            after the grace period is killed. The grace period is the one `dpctl app run` was \
            given (5s by default) unless --grace says otherwise.
            """)

    @OptionGroup var device: DeviceOptions
    @Option(
        help: ArgumentHelp(
            "How long the app has to end before it is killed (at most 1h; default: what `dpctl app run` was given).",
            valueName: "duration"))
    var grace: String?
    @Argument(help: ArgumentHelp("The app's identifier.", valueName: "id")) var identifier: String

    func validate() throws { if let grace { try validateGrace(grace) } }

    func run() async throws {
        let id = try appIdentifier(identifier)
        try AppSwitcher(manager: try await containerManager(device)).terminate(id, grace: try grace.map(parseDuration))
        printOut("\(id): stopping")
    }
}

/// A grace period before an app is killed: a duration of at most an hour.
func validateGrace(_ text: String) throws {
    guard try parseDuration(text) <= LifecycleSettings.longestTerminationDeadline else {
        throw ValidationError("--grace is at most 1h (it was \(text))")
    }
}

/// Moves the app `identifier` to the back or the front with `move`, and prints the states it
/// went through.
private func switchApp(
    _ identifier: String, _ device: DeviceOptions, _ move: (AppSwitcher, AppIdentifier) throws -> [ApplicationState]
) async throws {
    let id = try appIdentifier(identifier)
    let states = try move(AppSwitcher(manager: try await containerManager(device)), id)
    printOut("\(id): \(states.map(\.description).joined(separator: ", "))")
}
