import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionLifecycle
import DataProtectionTestSupport
import Foundation
import SystemPackage
import Testing

/// A supervisor in this process (so its clock is the test's ``ManualClock``) running real,
/// sandboxed `dp-test-app lifecycle` processes, driven line by line.
final class Lab: @unchecked Sendable {
    let device: TestDevice
    let manager: ContainerManager
    let service: LifecycleService
    let supervisor: AppSupervisor

    init(settings: LifecycleSettings = LifecycleSettings(), environment: [String: String] = [:], usesCgroups: Bool = true) async throws {
        device = try await TestDevice.make()
        try await device.keybag.unlock(passcode: "123456")
        manager = ContainerManager(files: device.files)
        service = LifecycleService(manager: manager, settings: settings, clock: device.clock,
                                   environment: ProcessInfo.processInfo.environment.merging(environment) { $1 })
        supervisor = AppSupervisor(manager: manager, services: [service], usesCgroups: usesCgroups)
    }

    /// Installs and launches `id` as `dp-test-app lifecycle`; returns once it said "ready".
    func launch(_ id: String) async throws -> LabApp {
        let identifier = try AppIdentifier(id)
        if (try? manager.app(identifier)) == nil { _ = try await manager.install(identifier) }
        let container = try manager.app(identifier).url.path
        // What the app writes there is read back through the containers' file system.
        let served = ContainerFileSystem.mountPoint(for: manager.layout) + container.dropFirst(manager.layout.containers.count)
        let app = try LabApp(identifier: identifier, container: container, served: served)
        let supervisor = self.supervisor
        let (input, output) = (app.input.fileHandleForReading.fileDescriptor, app.output.fileHandleForWriting.fileDescriptor)
        app.run = Task {
            try await supervisor.run(identifier, command: [AppWorld.testApp, "lifecycle"],
                                     standardInput: FileDescriptor(rawValue: input), standardOutput: FileDescriptor(rawValue: output))
        }
        let first: String
        do { first = try await app.line() } catch {
            app.input.fileHandleForWriting.closeFile()
            throw TestFailure("\(id) did not start: \(String(describing: await app.run!.result))")
        }
        #expect(first == "state active")
        #expect(try await app.line() == "ready")
        return app
    }

    func state(_ app: LabApp) -> ApplicationState? { service.states(of: app.identifier).first }
    func status(_ app: LabApp) -> AppLifecycleStatus? { service.status(of: app.identifier).first }
}

final class LabApp: @unchecked Sendable {
    let identifier: AppIdentifier
    let container: String
    /// The container through the file system serving it (while the app runs).
    let served: String
    let input = Pipe(), output = Pipe()
    var run: Task<Int32, any Error>?

    init(identifier: AppIdentifier, container: String, served: String) throws {
        self.identifier = identifier
        self.container = container
        self.served = served
    }

    /// The app's next line, read on a thread of its own (never blocking the tasks the
    /// supervisor's timers run on).
    func line() async throws -> String {
        let fd = output.fileHandleForReading.fileDescriptor
        return try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try readLine(fd, timeout: 300) }) }.start()
        }
    }
    func send(_ command: String) { input.fileHandleForWriting.write(Data((command + "\n").utf8)) }
    func ask(_ command: String) async throws -> String {
        send(command)
        return try await line()
    }
    func expectLines(_ expected: [String], sourceLocation: SourceLocation = #_sourceLocation) async throws {
        for line in expected { #expect(try await self.line() == line, sourceLocation: sourceLocation) }
    }
    func quit() async throws -> Int32 {
        send("quit")
        return try await run!.value
    }
    /// The count `dp-test-app`'s `counter` command keeps writing.
    func counter() -> Int { Int((try? String(contentsOfFile: served + "/tmp/counter", encoding: .utf8)) ?? "") ?? 0 }
}

/// Waits (bounded) until `condition` holds: for a real process to make progress we do not control.
func eventually(_ condition: () -> Bool) -> Bool {
    for _ in 0..<3000 {
        if condition() { return true }
        usleep(1000)
    }
    return false
}

/// Every test here runs real processes: one at a time (a fork chain loads both cores; the
/// real-clock tests need them), in a process of their own (scripts/test).
@Suite(.serialized) struct RealProcessLifecycleTests {}

extension RealProcessLifecycleTests {
@Suite(.serialized) struct LifecycleTests {
    @Test func theHomeButtonAndTheLockMoveTheAppInIOSOrder() async throws {
        let lab = try await Lab()
        let app = try await lab.launch("com.example.states")

        lab.service.moveToBackground(app.identifier)
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        #expect(try await app.ask("state") == "state background")
        try lab.service.moveToForeground(app.identifier)
        try await app.expectLines(["event willEnterForeground", "event didBecomeActive"])

        // The lock sends the app in front to the background; the unlock brings it back.
        await lab.device.keybag.lock()
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        #expect(throws: LifecycleError.self) { try lab.service.moveToForeground(app.identifier) }
        try await lab.device.keybag.unlock(passcode: "123456")
        try await app.expectLines(["event willEnterForeground", "event didBecomeActive"])

        // An app the user sent to the background stays there across a lock and an unlock.
        lab.service.moveToBackground(app.identifier)
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        await lab.device.keybag.lock()
        try await lab.device.keybag.unlock(passcode: "123456")
        #expect(try await app.ask("state") == "state background")
        try lab.service.moveToForeground(app.identifier)
        try await app.expectLines(["event willEnterForeground", "event didBecomeActive"])

        // Stopping: willResignActive, willTerminate; the app exits on its own.
        lab.service.terminateAll()
        try await app.expectLines(["event willResignActive", "event willTerminate"])
        #expect(try await app.run!.value == 0)
    }

    @Test func dpctlPressesTheHomeButtonOfAnAppAnotherProcessRuns() async throws {
        let lab = try await Lab()
        let app = try await lab.launch("com.example.remote")
        let cli = CLI(root: lab.device.root, work: lab.device.dir)
        let background = try cli.run(["app", "background", "com.example.remote"])
        #expect(background.status == 0 && background.out.trimmingCharacters(in: .newlines) == "com.example.remote: background", "\(background.stderr)")
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        let state = try cli.run(["app", "state", "com.example.remote", "--json"])
        let report = try #require(try JSONSerialization.jsonObject(with: state.stdout) as? [[String: Any]])
        #expect(report.first?["state"] as? String == "background")
        #expect(report.first?["backgroundTimeRemaining"] as? Double == 30)
        #expect(try cli.run(["app", "foreground", "com.example.remote"]).out.trimmingCharacters(in: .newlines) == "com.example.remote: active")
        try await app.expectLines(["event willEnterForeground", "event didBecomeActive"])
        #expect(try await app.quit() == 0)
        // Not running: a clear error with what to do.
        let gone = try cli.run(["app", "background", "com.example.remote"])
        #expect(gone.status == 1 && gone.stderr.contains("not running") && gone.stderr.contains("dpctl app run"), "\(gone.stderr)")
    }

    @Test(arguments: [true, false])
    func aBackgroundAppWithoutATaskIsReallySuspendedAndResumedInFront(cgroups: Bool) async throws {
        let lab = try await Lab(usesCgroups: cgroups)
        let app = try await lab.launch("com.example.forgetful")
        #expect(try await app.ask("counter " + app.container + "/tmp/counter") == "counting")
        #expect(eventually { app.counter() > 0 })

        lab.service.moveToBackground(app.identifier)
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        lab.device.clock.advance(by: 4)
        #expect(lab.state(app) == .background)
        let running = app.counter()
        #expect(eventually { app.counter() > running }, "still running 4 s in")

        lab.device.clock.advance(by: 1)
        await lab.service.wait(until: app.identifier, is: .suspended)
        let status = try #require(lab.status(app))
        #expect(status.stoppedByKernel, "the kernel shows it stopped (\(status.suspension))")
        #expect(cgroups ? ["cgroup freezer", "SIGSTOP"].contains(status.suspension) : status.suspension == "SIGSTOP")
        let frozen = app.counter()
        app.send("state")   // a suspended app answers nothing
        #expect(staysSilent(app.output.fileHandleForReading.fileDescriptor, milliseconds: 300))
        #expect(app.counter() == frozen, "its counter stopped")

        try lab.service.moveToForeground(app.identifier)
        // Resumed, the app reads the question it was sent while stopped and the foreground
        // events on two channels: their order is not defined, but the answer must be true when
        // given. An event's state is set just before its line is printed, so an answer before
        // willEnterForeground's line is background or inactive, between the two inactive or
        // active, after both active.
        var lines: [String] = []
        for _ in 0..<3 { lines.append(try await app.line()) }
        let events = lines.filter { $0.hasPrefix("event ") }
        #expect(events == ["event willEnterForeground", "event didBecomeActive"], "\(lines)")
        let answer = try #require(lines.firstIndex { $0.hasPrefix("state ") }, "\(lines)")
        #expect([["state background", "state inactive"], ["state inactive", "state active"], ["state active"]][answer].contains(lines[answer]), "\(lines)")
        #expect(eventually { app.counter() > frozen }, "counting again")
        #expect(try await app.quit() == 0)
    }

    @Test func aTaskKeepsTheAppRunningItsHandlerIsWarnedAndAnOverrunIsCutOff() async throws {
        let lab = try await Lab()
        let app = try await lab.launch("com.example.uploader")
        #expect(try await app.ask("begin upload") == "began upload 1")
        #expect(try await app.ask("remaining") == "remaining unlimited")
        lab.service.moveToBackground(app.identifier)
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])

        lab.device.clock.advance(by: 10)
        #expect(try await app.ask("remaining") == "remaining 20", "a task keeps it running past the 5 s")
        lab.device.clock.advance(by: 14)   // 24 s: no warning yet
        #expect(try await app.ask("state") == "state background")
        lab.device.clock.advance(by: 1)    // 25 s: every running task's expiration handler
        #expect(try await app.line() == "expiring upload")
        #expect(lab.state(app) == .background)
        lab.device.clock.advance(by: 5)    // 30 s: the overrunning task is ended by the system
        await lab.service.wait(until: app.identifier, is: .suspended)
        #expect(lab.status(app)?.tasks.isEmpty == true)

        try lab.service.moveToForeground(app.identifier)
        try await app.expectLines(["event willEnterForeground", "event didBecomeActive"])
        #expect(try await app.quit() == 0)
    }

    @Test func aTaskEndedByItsHandlerLetsTheAppSuspendAndEachTripHasItsOwnBudget() async throws {
        let lab = try await Lab(settings: LifecycleSettings(backgroundTimeBudget: 600, expirationWarning: 5))
        let app = try await lab.launch("com.example.polite")
        #expect(try await app.ask("begin sync end-on-expiry") == "began sync 1")
        lab.service.moveToBackground(app.identifier)
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        lab.device.clock.advance(by: 594)
        #expect(try await app.ask("remaining") == "remaining 6", "the seed's 10 minutes, as a setting")
        lab.device.clock.advance(by: 1)
        try await app.expectLines(["expiring sync", "ending sync"])
        await lab.service.wait(until: app.identifier, is: .suspended)

        // A new trip to the background starts a new budget.
        try lab.service.moveToForeground(app.identifier)
        try await app.expectLines(["event willEnterForeground", "event didBecomeActive"])
        lab.service.moveToBackground(app.identifier)
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        #expect(try await app.ask("remaining") == "remaining 600")
        #expect(try await app.ask("begin second") == "began second 2")
        #expect(try await app.ask("end second") == "ending second")
        lab.device.clock.advance(by: 5)
        await lab.service.wait(until: app.identifier, is: .suspended)
        try lab.service.moveToForeground(app.identifier)
        try await app.expectLines(["event willEnterForeground", "event didBecomeActive"])
        #expect(try await app.quit() == 0)
    }

    @Test func performExpiringActivityRunsAsATaskAndIsToldWhenItsTimeIsUp() async throws {
        let lab = try await Lab()
        let app = try await lab.launch("com.example.activity")
        #expect(try await app.ask("activity") == "activity running")
        lab.service.moveToBackground(app.identifier)
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        lab.device.clock.advance(by: 20)
        #expect(lab.state(app) == .background, "the activity keeps it running")
        lab.device.clock.advance(by: 5)
        try await app.expectLines(["activity expired", "activity done"])
        await lab.service.wait(until: app.identifier, is: .suspended)   // the block returned: its task ended
        try lab.service.moveToForeground(app.identifier)
        try await app.expectLines(["event willEnterForeground", "event didBecomeActive"])
        #expect(try await app.quit() == 0)
    }

    @Test func classesKeepTheirMeaningDuringABackgroundTaskAcrossALock() async throws {
        let lab = try await Lab()
        let app = try await lab.launch("com.example.journal")
        let secret = URL(fileURLWithPath: app.container + "/Documents/a.txt")
        try await lab.device.files.write(Data("class A".utf8), to: secret, protection: .complete)
        #expect(try await app.ask("open-b " + app.container + "/Documents/journal") == "opened class B")
        #expect(try await app.ask("begin queue") == "began queue 1")

        await lab.device.keybag.lock()
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        lab.device.clock.advance(by: 11)   // past the 10 s grace period: class A's key is gone
        #expect(await lab.device.keybag.isProtectedDataAvailable == false)
        #expect(try await app.ask("append written after the lock") == "appended", "class B opened before the lock: still written")
        #expect(try await app.ask("read " + secret.path) == "unavailable", "class A: the typed error")
        #expect(try await app.ask("create-b " + app.container + "/Documents/new.txt") == "created class B")
        #expect(try await app.ask("end queue") == "ending queue")
        await lab.service.wait(until: app.identifier, is: .suspended)
        #expect(await lab.device.keybag.isProtectedDataAvailable == false, "tasks postpone nothing in the keybag")

        try await lab.device.keybag.unlock(passcode: "123456")
        try await app.expectLines(["event willEnterForeground", "event didBecomeActive"])
        #expect(try await app.ask("read " + secret.path) == "read class A")
        #expect(try String(decoding: await lab.device.files.contents(of: URL(fileURLWithPath: app.container + "/Documents/journal")), as: UTF8.self)
                == "written after the lock")
        #expect(try await app.quit() == 0)
    }

    @Test func anAppThatIgnoresWillTerminateIsKilledAtTheDeadline() async throws {
        let lab = try await Lab()
        let app = try await lab.launch("com.example.stubborn")
        #expect(try await app.ask("ignore-terminate") == "ignoring willTerminate")
        lab.service.terminateAll()
        try await app.expectLines(["event willResignActive", "event willTerminate"])
        #expect(try await app.ask("state") == "state background")
        lab.device.clock.advance(by: 5)
        #expect(try await app.run!.value == 128 + SIGKILL)
    }

    @Test func aRunningTaskHoldsALogindSleepDelayInhibitorUntilTheLastEnds() async throws {
        let bus = try PrivateBus()
        let logind = try LogindStandIn(bus: bus.address)
        let lab = try await Lab(environment: ["DBUS_SYSTEM_BUS_ADDRESS": bus.address])
        let app = try await lab.launch("com.example.inhibiting")
        #expect(try await app.ask("begin first") == "began first 1")
        #expect(try await logind.line() == "inhibit sleep|com.example.inhibiting|background task 'first'|delay")
        #expect(try await app.ask("begin second") == "began second 2")
        #expect(try await app.ask("end first") == "ending first")
        #expect(staysSilent(logind.output.fileHandleForReading.fileDescriptor, milliseconds: 200), "one task still runs")
        #expect(try await app.ask("end second") == "ending second")
        #expect(try await logind.line() == "released sleep|com.example.inhibiting|background task 'first'|delay")
        #expect(try await app.quit() == 0)
    }

    @Test func withoutLogindTasksStillWork() async throws {
        let lab = try await Lab(environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/system_bus_socket"])
        let app = try await lab.launch("com.example.nologind")
        #expect(try await app.ask("begin work") == "began work 1")
        lab.service.moveToBackground(app.identifier)
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        lab.device.clock.advance(by: 10)
        #expect(try await app.ask("end work") == "ending work")
        await lab.service.wait(until: app.identifier, is: .suspended)
        try lab.service.moveToForeground(app.identifier)
        try await app.expectLines(["event willEnterForeground", "event didBecomeActive"])
        #expect(try await app.quit() == 0)
    }

    @Test func sigtermToDpctlAppRunSendsWillTerminate() throws {
        let world = try AppWorld.make()
        try world.install("com.example.term")
        let input = Pipe()   // held open: the app waits for commands until it hears willTerminate
        let (process, out) = try world.start("com.example.term", ["lifecycle"], extra: ["--passcode-file", world.passcode], input: input)
        #expect(try readLine(out.fileHandleForReading.fileDescriptor) == "state active")
        #expect(try readLine(out.fileHandleForReading.fileDescriptor) == "ready")
        process.terminate()
        let heard = [try readLine(out.fileHandleForReading.fileDescriptor), try readLine(out.fileHandleForReading.fileDescriptor)]
        #expect(heard == ["event willResignActive", "event willTerminate"])
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        try input.fileHandleForWriting.close()
    }
}
}

extension RealProcessLifecycleTests {
@Suite struct ForkChainTests {
    /// Without a cgroup, a chain of processes that each fork a successor and exit always had
    /// one member running while the supervisor reported "suspended". Suspended is now reported
    /// only when the kernel shows every process stopped; an app that cannot be stopped is ended.
    @Test(arguments: [true, false])
    func anAppIsNeverReportedSuspendedWhileAPartOfItRuns(cgroups: Bool) async throws {
        let lab = try await Lab(usesCgroups: cgroups)
        let app = try await lab.launch("com.example.chain")
        #expect(try await app.ask("fork-chain") == "chaining")
        lab.service.moveToBackground(app.identifier)
        try await app.expectLines(["event willResignActive", "event didEnterBackground"])
        lab.device.clock.advance(by: 10)
        #expect(eventually { lab.state(app) == .suspended || lab.state(app) == nil }, "neither suspended nor ended")
        if lab.state(app) == .suspended {
            let status = try #require(lab.status(app))
            #expect(status.stoppedByKernel, "reported suspended while a part of it runs (\(status.suspension))")
            try lab.service.moveToForeground(app.identifier)
            _ = try await app.quit()
        } else {
            #expect(try await app.run!.value == 128 + SIGKILL, "ended, as an app that cannot be suspended")
        }
    }

}

/// The same with real processes all the way: keybagd holds the lock, `dpctl app run` supervises,
/// `dpctl lock` / `unlock` move the app, on the real clock (nothing here waits for a deadline).
@Suite(.serialized) struct LifecycleThroughKeybagdTests {
    @Test func dpctlLockSendsTheAppToTheBackgroundAndUnlockBringsItBack() throws {
        var world = try AppWorld.make()
        let daemon = try KeybagdProcess(cli: world.cli)
        defer { daemon.stop() }
        world.environment = daemon.environment
        try world.install("com.example.locked")
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode]).status == 0)
        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", world.cli.root, "app", "run", "com.example.locked", "--", AppWorld.testApp, "lifecycle"]
        process.environment = ProcessInfo.processInfo.environment.merging(daemon.environment) { $1 }
        let input = Pipe(), out = Pipe()
        process.standardInput = input
        process.standardOutput = out
        try process.run()
        let fd = out.fileHandleForReading.fileDescriptor
        #expect(try readLine(fd) == "state active")
        #expect(try readLine(fd) == "ready")
        #expect(try world.dpctl(["lock"]).status == 0)
        #expect([try readLine(fd), try readLine(fd)] == ["event willResignActive", "event didEnterBackground"])
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode]).status == 0)
        #expect([try readLine(fd), try readLine(fd)] == ["event willEnterForeground", "event didBecomeActive"])
        let stop = try world.dpctl(["app", "stop", "com.example.locked"])
        #expect(stop.status == 0, "\(stop.stderr)")
        #expect([try readLine(fd), try readLine(fd)] == ["event willResignActive", "event willTerminate"])
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        try input.fileHandleForWriting.close()
    }
}
}

/// `dpctl app stop` as a service manager stops a service: SIGTERM to every process of the app,
/// then SIGKILL after the grace period. Real sandboxed apps: a shell with a `trap`, a Python child
/// with a handler.
@Suite(.serialized) struct AppStopTests {
    /// Starts `dpctl app run ID --grace GRACE -- /bin/sh -c SCRIPT` and reads its first `lines`.
    func start(_ world: AppWorld, _ id: String, grace: String, script: String) throws -> (Process, Int32) {
        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", world.cli.root, "app", "run", id, "--passcode-file", world.passcode, "--grace", grace, "--", "/bin/sh", "-c", script]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        return (process, out.fileHandleForReading.fileDescriptor)
    }

    @Test func aShellTrapAndAPythonHandlerRunAtStop() throws {
        let world = try AppWorld.make()
        try world.install("com.example.shell")
        let script = """
            trap 'echo "shell trapped"; wait $python; exit 7' TERM
            /usr/bin/python3 -c '
            import signal, sys
            def ended(*_):
                print("python handler", flush=True); sys.exit(3)
            signal.signal(signal.SIGTERM, ended)
            print("python ready", flush=True)
            signal.pause()
            ' &
            python=$!   # waited for in the trap: the app ends with its shell, and the sandbox with the app
            echo "shell ready"
            while :; do sleep 100 & wait $!; done
            """
        let (process, out) = try start(world, "com.example.shell", grace: "60s", script: script)
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        #expect(Set([try readLine(out, timeout: 60), try readLine(out, timeout: 60)]) == ["shell ready", "python ready"])
        let stop = try world.dpctl(["app", "stop", "com.example.shell"])
        #expect(stop.status == 0, "\(stop.stderr)")
        // Both handlers ran: the shell's trap ended the app with its own status, long before
        // a 60 s grace period would have ended it with SIGKILL (137).
        #expect(Set([try readLine(out, timeout: 30), try readLine(out, timeout: 30)]) == ["shell trapped", "python handler"])
        process.waitUntilExit()
        #expect(process.terminationStatus == 7)
    }

    /// What ignores SIGTERM is killed once the grace period `dpctl app stop --grace` gives is over.
    @Test func whatIgnoresSIGTERMIsKilledAfterTheGracePeriod() throws {
        let world = try AppWorld.make()
        try world.install("com.example.stubborn")
        let (process, out) = try start(world, "com.example.stubborn", grace: "1h",
                                       script: "trap '' TERM; echo ready; while :; do sleep 100 & wait $!; done")
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        #expect(try readLine(out, timeout: 60) == "ready")
        #expect(try world.dpctl(["app", "stop", "com.example.stubborn", "--grace", "2h"]).status == 64)
        let stop = try world.dpctl(["app", "stop", "com.example.stubborn", "--grace", "0.2s"])
        #expect(stop.status == 0, "\(stop.stderr)")
        process.waitUntilExit()
        #expect(process.terminationStatus == 128 + SIGKILL)
    }
}

/// `Tests/oracle/logind_inhibit_standin.py`: logind's `Inhibit`, on a private bus.
final class LogindStandIn: @unchecked Sendable {
    let process = Process()
    let output = Pipe()
    init(bus: String) throws {
        process.executableURL = URL(fileURLWithPath: oraclePython)
        process.arguments = [packageRoot.appendingPathComponent("Tests/oracle/logind_inhibit_standin.py").path]
        process.environment = ProcessInfo.processInfo.environment.merging(["DBUS_SYSTEM_BUS_ADDRESS": bus]) { $1 }
        process.standardOutput = output
        try process.run()
        guard try readLine(output.fileHandleForReading.fileDescriptor) == "ready" else { throw TestFailure("the logind stand-in did not start (jeepney in the venv?)") }
    }
    /// The app's next line, read on a thread of its own (never blocking the tasks the
    /// supervisor's timers run on).
    func line() async throws -> String {
        let fd = output.fileHandleForReading.fileDescriptor
        return try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try readLine(fd) }) }.start()
        }
    }
    deinit { process.terminate() }
}
