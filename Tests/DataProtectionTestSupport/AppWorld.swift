import Foundation

/// A device with apps, driven through the built `dpctl` (as a user would) and the test app
/// (`dp-test-app`, as an app would from inside its sandbox).
public struct AppWorld: Sendable {
    public let cli: CLI
    public let passcode: String
    public var environment: [String: String] = [:]

    public static func make() throws -> AppWorld {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456")
        let world = AppWorld(cli: cli, passcode: passcode)
        let result = try cli.run(["init", "--passcode-file", passcode])
        guard result.status == 0 else { throw TestFailure("init: \(result.stderr)") }
        return world
    }

    public static var testApp: String { CLI.executable.deletingLastPathComponent().appendingPathComponent("dp-test-app").path }

    @discardableResult
    public func dpctl(_ args: [String], input: Data = Data(), environment extra: [String: String] = [:]) throws -> CLI.Result {
        try cli.run(args, input: input, environment: environment.merging(extra) { $1 })
    }

    /// Installs `id` and returns its container's path.
    @discardableResult
    public func install(_ id: String, _ options: [String] = []) throws -> String {
        let result = try dpctl(["app", "install", id] + options)
        guard result.status == 0 else { throw TestFailure("install \(id): \(result.stderr)") }
        return try container(id)
    }

    public func container(_ id: String) throws -> String {
        let info = try dpctl(["app", "info", id, "--json"])
        guard let object = try JSONSerialization.jsonObject(with: info.stdout) as? [String: Any], let path = object["container"] as? String else {
            throw TestFailure("info \(id): \(info.stderr)")
        }
        return path
    }

    public func groupContainer(of app: String, _ group: String) throws -> String {
        let info = try JSONSerialization.jsonObject(with: try dpctl(["app", "info", app, "--json"]).stdout) as? [String: Any]
        let groups = info?["groups"] as? [[String: Any]] ?? []
        guard let path = groups.first(where: { $0["identifier"] as? String == group })?["container"] as? String else { throw TestFailure("no \(group)") }
        return path
    }

    /// The options that unlock an app run with the device's passcode, unless `extra` says how
    /// already: a device used after its first unlock, as apps are (before it, class C — every
    /// container's default — can be neither read nor created, on the protected file system as
    /// on iOS). `locked: true` runs the app before any unlock; with keybagd (an ``environment``
    /// set), the device's own state holds, as the test set it.
    func unlocking(_ extra: [String], locked: Bool) -> [String] {
        locked || !environment.isEmpty || extra.contains("--passcode-file") ? extra : extra + ["--passcode-file", passcode]
    }

    /// `dpctl app run ID -- /bin/sh -c SCRIPT`, after the first unlock.
    public func shell(_ id: String, _ script: String, extra: [String] = [], locked: Bool = false) throws -> CLI.Result {
        try dpctl(["app", "run", id] + unlocking(extra, locked: locked) + ["--", "/bin/sh", "-c", script])
    }

    /// Starts `dpctl app run ID -- dp-test-app ARGS` (after the first unlock) and returns it with
    /// its standard output. `input`, when given, is the app's standard input (else this process's).
    public func start(_ id: String, _ args: [String], extra: [String] = [], locked: Bool = false, input: Pipe? = nil) throws -> (Process, Pipe) {
        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", cli.root, "app", "run", id] + unlocking(extra, locked: locked) + ["--", Self.testApp] + args
        let out = Pipe()
        process.standardOutput = out
        if let input { process.standardInput = input }
        try process.run()
        return (process, out)
    }

    /// `dpctl app run ID -- dp-test-app ARGS`, after the first unlock.
    public func testApp(_ id: String, _ args: [String], extra: [String] = [], locked: Bool = false) throws -> CLI.Result {
        try dpctl(["app", "run", id] + unlocking(extra, locked: locked) + ["--", Self.testApp] + args)
    }
}

public struct TestFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Shell lines that report whether an attempt worked: `NAME ok` or `NAME denied`.
public func attempt(_ name: String, _ command: String) -> String {
    "if ( \(command) ) >/dev/null 2>&1; then echo '\(name) ok'; else echo '\(name) denied'; fi"
}

/// The attempts' outcomes, by name.
public func outcomes(_ output: String) -> [String: String] {
    var result: [String: String] = [:]
    for line in output.split(separator: "\n") {
        let parts = line.split(separator: " ")
        if parts.count == 2, parts[1] == "ok" || parts[1] == "denied" { result[String(parts[0])] = String(parts[1]) }
    }
    return result
}
