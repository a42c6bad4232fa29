import DataProtection
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Runs an app: confined in its sandbox (``SandboxProfile``), with the supervisor socket as its
/// only way out, through which this process serves it the keys of its own files
/// (FORMAT.md §10.3) — `dpctl app run` is this.
///
/// ```swift
/// let supervisor = AppSupervisor(manager: manager)
/// let status = try await supervisor.run(AppIdentifier("com.example.notes"), command: ["/usr/bin/notes"])
/// ```
///
/// The supervisor and the app end together: the app dies with the supervisor (bubblewrap's
/// `--die-with-parent` and its pid namespace), and the supervisor returns when the app ends.
/// While it runs, the app cannot be uninstalled.
public final class AppSupervisor: Sendable {
    public let manager: ContainerManager
    /// What this supervisor serves its apps besides their keys (``AppSupervisorService``).
    public let services: [any AppSupervisorService]
    public var keybag: Keybag { manager.files.keybag }
    private let logger = Logger(label: "app-supervisor")
    /// Keybag channels one app may hold open at once.
    static let maxChannels = 64

    /// Whether each app gets a cgroup of its own where this user may make one (so it can be
    /// frozen whole); `false` suspends apps with `SIGSTOP` everywhere.
    public let usesCgroups: Bool
    /// Starts the server of the protected file system that serves the containers to sandboxed
    /// apps (``ContainerFileSystem``): every regular file any program of theirs writes is a
    /// protected file of its container's class.
    public let fileSystem: ContainerFileSystem.Launcher

    /// - Parameter fileSystem: how the containers' file system is started when no server runs
    ///   for the data root; by default, in this process (``ContainerFileSystem/inProcess(_:)``:
    ///   it serves while this process's apps run). `dpctl` starts a process of its own.
    public init(
        manager: ContainerManager, services: [any AppSupervisorService] = [], usesCgroups: Bool = true,
        fileSystem: ContainerFileSystem.Launcher? = nil
    ) {
        self.manager = manager
        self.services = services
        self.usesCgroups = usesCgroups
        self.fileSystem = fileSystem ?? ContainerFileSystem.inProcess(manager)
    }

    /// Runs `command` (a path, or a name looked up on `PATH`) as `identifier` and returns its exit
    /// status (128 + the signal's number when a signal ended it).
    ///
    /// - Parameters:
    ///   - sandboxed: `false` runs the app unconfined (it still gets its places and the
    ///     supervisor socket); callers must say so to the user.
    ///   - standardInput, standardOutput, standardError: the app's descriptors 0, 1 and 2
    ///     (this process's own by default).
    /// - Throws: ``ContainerError/sandboxUnavailable(_:)`` when this machine lacks a part of the
    ///   sandbox (nothing is run), ``ContainerError/launchFailed(_:)`` when the app could not
    ///   start in it, ``ContainerError/unknownApp(_:)``.
    public func run(
        _ identifier: AppIdentifier, command: [String], sandboxed: Bool = true,
        environment: [String: String] = ProcessInfo.processInfo.environment,
        standardInput: FileDescriptor = .standardInput, standardOutput: FileDescriptor = .standardOutput,
        standardError: FileDescriptor = .standardError
    ) async throws -> Int32 {
        let (input, output, errors) = (standardInput.rawValue, standardOutput.rawValue, standardError.rawValue)
        guard let name = command.first, !name.isEmpty else { throw ContainerError.launchFailed("no command given") }
        let app = try manager.app(identifier)
        let groups = try app.groups.map { try manager.group($0) }
        let requirements = sandboxed ? try SandboxRequirements.probe(environment: environment) : nil
        let executable = try Self.resolve(name, environment: environment)
        if executable.hasPrefix(manager.layout.containers + "/") {
            throw ContainerError.launchFailed(
                "\(name): a program inside a container cannot be run as an app (apps could replace it)")
        }
        let running = try RunningAppLock.shared(manager.layout, app.uuid)
        defer { running.release() }
        restoreModes(app, groups)
        restoreInboxLink(app)

        // The containers through the protected file system, held while the app runs.
        var lease: ContainerFileSystem.Lease?
        if requirements != nil { lease = try ContainerFileSystem.lease(manager.layout, launch: fileSystem) }
        defer { withExtendedLifetime(lease) {} }

        var appEnvironment = Self.appEnvironment(app, groups: groups, passing: environment)
        appEnvironment[SupervisorProtocol.descriptorVariable] = String(SandboxProfile.supervisorDescriptor)
        let description = AppDescription(
            identifier: app.identifier.rawValue, container: app.url.path,
            groups: Dictionary(uniqueKeysWithValues: groups.map { ($0.identifier.rawValue, $0.url.path) }),
            sandboxed: sandboxed, servedByFileSystem: lease != nil)

        let control = try SocketPair()
        let status = try Pipe2()
        let bwrapErrors = try Pipe2()
        let argv: [String]
        var descriptors: [Int32]
        // The network entitlement: user-mode networking, attached before the app starts.
        let networking = sandboxed && app.metadata.network == true
        let slirp4netns = networking ? SandboxRequirements.slirp4netns(environment: environment) : nil
        if networking, slirp4netns == nil {
            throw ContainerError.sandboxUnavailable(
                "\(identifier) has the network entitlement, and slirp4netns is not installed: apt-get install slirp4netns"
            )
        }
        let limits = AppResourceLimits(metadata: app.metadata)
        let layout = manager.layout
        let servedPath = lease.map { held -> @Sendable (String) -> String in { held.served($0, layout: layout) } }
        // bubblewrap holds the sandbox before the app starts while the supervisor sets it up.
        let info = sandboxed ? try Pipe2() : nil, block = sandboxed ? try Pipe2() : nil
        if let requirements {
            let profile = SandboxProfile(
                requirements: requirements, app: app, groups: groups, executable: executable,
                arguments: Array(command.dropFirst()), environment: appEnvironment, limits: limits,
                servedFrom: servedPath)
            try profile.validate()
            argv = [requirements.bubblewrap] + profile.bubblewrapArguments()
            descriptors = [input, output, bwrapErrors.write, control.app, status.write, errors]
            if let info, let block { descriptors += [info.write, block.read] }
        } else {
            argv = [executable] + command.dropFirst()
            descriptors = [input, output, errors, control.app]
        }
        // What a supervisor killed outright left of this app (processes, perhaps frozen) ends now.
        let hierarchies = usesCgroups ? AppCgroup.Hierarchies.current() : AppCgroup.Hierarchies()
        if usesCgroups { AppCgroup.reapOrphans(ofApp: app.uuid, in: hierarchies) }
        let cgroup =
            usesCgroups
            ? AppCgroup.make(
                name: "dataprotection-\(app.uuid.uuidString)-\(getpid())-\(UUID().uuidString.prefix(8))",
                limits: limits, in: hierarchies) : nil
        let run = RunningApp(
            app: app, cgroup: cgroup, limits: limits, ownUserNamespace: sandboxed, servedPath: servedPath)
        defer {
            run.ended()
            if run.exceededMemoryLimit {
                logger.warning(
                    "\(identifier) was ended by the kernel: it went over its memory limit (\(AppResourceLimits.describe(bytes: limits.memoryBytes)))"
                )
            }
            for service in services { service.appDidEnd(run) }
        }
        for service in services { try await service.appWillStart(run) }
        let service = AppService(description: description, run: run, keybag: keybag, services: services, logger: logger)
        try await service.start(control: control.supervisor)
        defer { service.stop() }

        let child = ChildProcess(
            path: argv[0], arguments: argv, environment: requirements == nil ? appEnvironment : [:],
            descriptors: descriptors)
        let spawned = try run.spawn(child)
        control.closeAppEnd()
        status.closeWriteEnd()
        bwrapErrors.closeWriteEnd()
        var network: UserModeNetwork?
        if let info, let block, requirements != nil {
            do {
                let sandbox = try SandboxNamespace.read(info: info)
                try lease?.admit(
                    sandboxProcess: sandbox.pid, app: app.uuid, territories: [app.url.path] + groups.map(\.url.path),
                    layout: layout)
                try sandbox.limitInotify(limits)
                if let slirp4netns {
                    network = try UserModeNetwork.attach(slirp4netns: slirp4netns, sandbox: sandbox, errors: errors)
                }
            } catch {
                if let pid = child.pid { kill(pid, SIGKILL) }
                _ = await child.exitStatus()
                throw error
            }
            // the sandbox goes on: the app starts with its budget and network (gone: its status says why)
            _ = block.send(Array("go".utf8))
            block.closeWriteEnd()
        }
        defer { if let network { Task { await network.stop() } } }
        if requirements != nil {
            let report = status.readAll()
            if report.first != UInt8(ascii: "R") || report.count > 1 {
                let code = await child.exitStatus()
                // dp-sandbox-exec's line (after its "R", if it got that far), else bubblewrap's.
                let fromHelper = report.first == UInt8(ascii: "R") ? Array(report.dropFirst()) : report
                let message = String(decoding: fromHelper.isEmpty ? bwrapErrors.readAll() : fromHelper, as: UTF8.self)
                let line =
                    message.split(separator: "\n").first.map(String.init) ?? "bubblewrap exited with status \(code)"
                throw ContainerError.launchFailed(line)
            }
            bwrapErrors.forward(to: errors)
        }
        if let pid = child.pid { run.launched(pid: pid, inCgroup: spawned) }
        for service in services { service.appDidLaunch(run) }
        return await child.exitStatus()
    }

    /// The app's environment: its places (so unmodified Foundation code finds them, and programs
    /// in any language their App Groups' containers), a plain `PATH`, and the user's locale and
    /// terminal; nothing else of the caller's.
    package static func appEnvironment(
        _ app: AppContainer, groups: [GroupContainer] = [], passing caller: [String: String]
    ) -> [String: String] {
        var env: [String: String] = [
            "HOME": app.url.path,
            "CFFIXED_USER_HOME": app.url.path,   // NSHomeDirectory()
            "TMPDIR": app.temporaryDirectory.path + "/",   // NSTemporaryDirectory()
            "XDG_CACHE_HOME": app.caches.path,   // .cachesDirectory
            "XDG_DATA_HOME": app.applicationSupport.path,   // .applicationSupportDirectory
            "XDG_CONFIG_HOME": app.preferences.path,
            "XDG_STATE_HOME": app.applicationSupport.path,
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            SupervisorProtocol.appVariable: app.identifier.rawValue,
            SupervisorProtocol.containerVariable: app.url.path,
        ]
        if !groups.isEmpty {
            env[SupervisorProtocol.groupContainersVariable] = groups.sorted {
                $0.identifier.rawValue < $1.identifier.rawValue
            }
            .map { "\($0.identifier.rawValue)=\($0.url.path)" }.joined(separator: "\n")
        }
        for key in [
            "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "TZ", "COLUMNS", "LINES", "NO_COLOR",
        ] {
            if let value = caller[key] { env[key] = value }
        }
        return env
    }

    /// `name` as a path: containing a `/`, made absolute; otherwise the first match on `PATH`.
    static func resolve(_ name: String, environment: [String: String]) throws -> String {
        var path = name
        if !name.contains("/") {
            guard let found = SandboxRequirements.findInPath(name, environment: environment) else {
                throw ContainerError.launchFailed("\(name): command not found")
            }
            path = found
        } else if !name.hasPrefix("/") {
            path = FileManager.default.currentDirectoryPath + "/" + name
        }
        let resolved = URL(fileURLWithPath: path).resolvingSymlinksInPath().path
        guard SandboxRequirements.isExecutable(resolved), !POSIXFile.kind(resolved).isDirectory else {
            throw ContainerError.launchFailed("\(name): not an executable file")
        }
        return resolved
    }

    /// An app may have `chmod`ed its container's root (or a group's) to lock itself or the
    /// group's other members out; each launch gives the roots back their mode (0700).
    private func restoreModes(_ app: AppContainer, _ groups: [GroupContainer]) {
        for url in [app.url] + groups.map(\.url) { _ = chmod(url.path, 0o700) }
    }

    /// An app may have removed its `Documents/Inbox` link; it is put back at each launch (if
    /// the app put something else there, that stays: it is the app's).
    private func restoreInboxLink(_ app: AppContainer) {
        if POSIXFile.linkStatus(app.inbox.path) == nil {
            _ = try? POSIXFile.call("symlink", app.inbox.path) { symlink(AppContainer.inboxLinkTarget, $0) }
        }
        if POSIXFile.linkStatus(app.inboxStorage.path) == nil { try? makeDirectory(app.inboxStorage.path) }
    }
}
