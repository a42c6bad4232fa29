@testable import DataProtectionFileSystem
import CFUSEKernel
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import Synchronization
import SystemPackage
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The server's table of inodes: room reserved before anything is made, shares by PID
/// namespace, and eviction that never asks twice for what a program pins.
struct NodeTableTests {
    /// A directory of `count` empty files, and a table serving it.
    private func table(files count: Int, maxNodes: Int = 64, shared: Bool = false) throws -> (NodeTable, String) {
        let directory = temporaryDirectory().path
        for index in 0..<count { #expect(FileManager.default.createFile(atPath: directory + "/f\(index)", contents: nil)) }
        let fd = open(directory, O_PATH | O_DIRECTORY | O_CLOEXEC)
        return (try NodeTable(rootDescriptor: fd, maxNodes: maxNodes, sharedByRequester: shared), directory)
    }

    private func lookUp(_ table: NodeTable, _ index: Int) throws(Errno) -> FileNode {
        try table.lookup(Array("f\(index)".utf8), in: table.root).0
    }

    /// A reservation holds its room until a node takes it or it is given back: makes running at
    /// once can never leave the table beyond its capacity.
    @Test func roomIsReservedBeforeAnythingIsMade() throws {
        let (table, _) = try self.table(files: 2)
        var reservations: [NodeTable.Reservation] = []
        while let reservation = try? table.reserve() { reservations.append(reservation) }
        #expect(reservations.count == 63)   // 64, the root's node among them
        #expect(throws: Errno.self) { try lookUp(table, 0) }
        // A node takes its reservation: no more room than before.
        let node = try table.lookup(Array("f0".utf8), in: table.root, reservation: reservations[0]).0
        table.release(reservations[0])
        #expect((try? table.reserve()) == nil)
        // A reservation given back is room again; the node forgotten, too.
        table.release(reservations[1])
        #expect(try lookUp(table, 1).id != node.id)
        table.forget(node.id, count: 1)
        let again = try table.reserve()
        table.release(again)
    }

    /// Shared, the table counts every node in the share of the PID namespace that asked for it:
    /// alone, a program gets two thirds; another namespace still finds the third left, and once
    /// the first forgets its nodes, it holds nothing and weighs on nobody.
    @Test func eachPIDNamespaceHasAShare() throws {
        let (table, _) = try self.table(files: 80, shared: true)
        Requester.begin(pid: UInt32(getpid()))
        var mine: [FileNode] = []
        for index in 0..<80 { guard let node = try? lookUp(table, index) else { break }; mine.append(node) }
        #expect(mine.count == 42, "64 × 2/3")
        let other = try ProcessInOwnPIDNamespace()
        defer { other.stop() }
        Requester.begin(pid: other.pid)
        var found: [FileNode] = []   // the first's, found again (no new node), then new ones
        for index in 0..<80 {
            guard let node = try? lookUp(table, index) else { break }
            found.append(node)
        }
        #expect(found.count - mine.count == 21, "what the first left")
        for node in mine + found { table.forget(node.id, count: 1) }
        Requester.begin(pid: other.pid)
        var now = 0
        for index in 0..<80 where (try? lookUp(table, index)) != nil { now += 1 }
        #expect(now == 42)
    }

    /// An admitted app's runs, each in a sandbox (a PID namespace) of its own, share one share:
    /// a relaunched app finds what its earlier runs left the kernel holding in its own share,
    /// not in a new one; another app still has its own.
    @Test func everyRunOfAnAppSharesItsShare() throws {
        let directory = temporaryDirectory().path
        for index in 0..<80 { #expect(FileManager.default.createFile(atPath: directory + "/f\(index)", contents: nil)) }
        let apps = ServedApps()
        let table = try NodeTable(rootDescriptor: open(directory, O_PATH | O_DIRECTORY | O_CLOEXEC), maxNodes: 64,
                                  sharedByRequester: true, apps: apps)
        let (first, second, other) = (try ProcessInOwnPIDNamespace(), try ProcessInOwnPIDNamespace(), try ProcessInOwnPIDNamespace())
        defer { first.stop(); second.stop(); other.stop() }
        let admissions = try [(first, "A"), (second, "A"), (other, "B")].map { process, app in
            try apps.admit(sandboxProcess: Int32(process.pid), app: app, territories: [directory])
        }
        defer { admissions.forEach { $0.end() } }
        func newNodes(asking pid: UInt32, from start: Int) -> Int {
            Requester.begin(pid: pid)
            var made = 0
            for index in start..<80 where (try? lookUp(table, index)) != nil { made += 1 }
            return made
        }
        #expect(newNodes(asking: first.pid, from: 0) == 42, "64 × 2/3")
        #expect(newNodes(asking: second.pid, from: 42) == 0, "the same app: its share is full")
        #expect(newNodes(asking: other.pid, from: 42) == 21, "another app: what the first left")
    }

    /// A node the kernel was asked to forget and still holds (a program pins it) is not asked
    /// for again until it is found again; files open are never candidates.
    @Test func evictionDoesNotAskTwiceForWhatIsPinned() throws {
        let (table, _) = try self.table(files: 60)
        var nodes: [FileNode] = []
        for index in 0..<40 { nodes.append(try lookUp(table, index)) }
        nodes[0].open.withLock { $0.handles = 1 }
        defer { nodes[0].open.withLock { $0.handles = 0 } }
        // Asked for, the oldest go first; those still held are not asked for again, so the
        // next pass asks for others, until none is left to ask for.
        let first = table.evictionCandidates(sparing: { _ in false })
        #expect(first.map(\.node.id) == nodes[1...(41 - table.lowWater)].map(\.id))
        var asked = Set(first.map(\.node.id))
        for _ in 0..<4 {
            let next = table.evictionCandidates(sparing: { _ in false })
            #expect(asked.isDisjoint(with: next.map(\.node.id)))
            asked.formUnion(next.map(\.node.id))
        }
        #expect(asked == Set(nodes.dropFirst().map(\.id)), "every file but the open one")
        #expect(table.evictionCandidates(sparing: { _ in false }).isEmpty)
        _ = try lookUp(table, 1)   // found again
        #expect(table.evictionCandidates(sparing: { _ in false }).map(\.node.id) == [nodes[1].id])
        // Renamed after it was asked for (the kernel forgot nothing: the name had moved), it is
        // asked for again, under its new name.
        table.move(nodes[2], to: table.root.id, name: Array("renamed".utf8))
        let again = table.evictionCandidates(sparing: { _ in false })
        #expect(again.map(\.node.id) == [nodes[2].id] && again.first?.name == Array("renamed".utf8))
    }

    /// A table left full by a pass that ran while its files were open does not stay full: once
    /// a file it passed over closes, the next request refused for want of room asks for a pass
    /// (it never waits for it), and that pass gives the closed files back. Refusals with nothing
    /// new to give back ask for none: a flood of refusals, or of files found and closed that a
    /// pass could already choose, never keeps the evictor busy for nothing.
    @Test func aTableFullOfFilesOpenAtThePassIsEmptiedWhenTheyClose() throws {
        let (table, _) = try self.table(files: 80)
        var nodes: [FileNode] = []
        while let node = try? lookUp(table, nodes.count) { nodes.append(node) }
        #expect(nodes.count == 63, "64, the root's node among them")
        for node in nodes { node.open.withLock { $0.handles = 1 } }
        while table.overflowing.wait(timeout: .now()) == .success {}   // passes asked while filling
        #expect(table.evictionCandidates(sparing: { _ in false }).isEmpty, "every file is open")
        table.evictionDone()
        #expect((try? lookUp(table, 70)) == nil)
        #expect(table.overflowing.wait(timeout: .now()) == .timedOut, "nothing changed since the pass")
        // Found again: nothing a pass could not choose before.
        _ = try lookUp(table, 0)
        #expect((try? lookUp(table, 70)) == nil)
        #expect(table.overflowing.wait(timeout: .now()) == .timedOut, "still nothing new to give back")
        for node in nodes {
            let passedOver = node.open.withLock { file in
                file.handles = 0
                defer { file.passedOverWhileOpen = false }
                return file.passedOverWhileOpen
            }
            #expect(passedOver)
            table.fileClosed()
        }
        #expect((try? lookUp(table, 70)) == nil, "refused, and answered at once")
        #expect(table.overflowing.wait(timeout: .now()) == .success, "the refusal asked for a pass")
        let given = table.evictionCandidates(sparing: { _ in false })
        table.evictionDone()
        #expect(given.count == 64 - table.lowWater)
        for candidate in given { table.forget(candidate.node.id, count: 1) }
        #expect(try lookUp(table, 70).id > nodes.last!.id, "room again")
    }
}

/// Admissions: a sandbox is served as its app for as long as any of its processes lives, even
/// once its supervisor's lease ended (a supervisor that dies closes its lease first); never the
/// server's own namespace, never a process gone.
struct ServedAppsTests {
    @Test func anAdmissionOutlivesItsLeaseUntilTheSandboxEnds() throws {
        let apps = ServedApps()
        let sandbox = try ProcessInOwnPIDNamespace()
        let namespace = try #require(Self.namespace(of: sandbox.pid))
        let admission = try apps.admit(sandboxProcess: Int32(sandbox.pid), app: "A", territories: [])
        admission.end()   // the lease is gone; the sandbox is not
        #expect(apps.app(inNamespace: namespace) != nil, "still served as the app while it runs")
        sandbox.stop()
        // The admission goes once the kernel reports the process ended (an event, not a delay).
        var waited = 0
        while apps.app(inNamespace: namespace) != nil && waited < 10_000 { usleep(1000); waited += 1 }
        #expect(apps.app(inNamespace: namespace) == nil)
    }

    @Test func neitherTheServersOwnNamespaceNorAProcessGoneIsAdmitted() throws {
        let apps = ServedApps()
        #expect(throws: MountError.self) { try apps.admit(sandboxProcess: getpid(), app: "A", territories: []) }
        let gone = try ProcessInOwnPIDNamespace()
        let pid = gone.pid
        gone.stop()
        var waited = 0   // until the kernel has reaped it (its SIGKILL is delivered after unshare's)
        while kill(pid_t(pid), 0) == 0 && waited < 10_000 { usleep(1000); waited += 1 }
        #expect(throws: MountError.self) { try apps.admit(sandboxProcess: Int32(pid), app: "A", territories: []) }
    }

    static func namespace(of pid: UInt32) -> UInt64? {
        var st = stat()
        return stat("/proc/\(pid)/ns/pid", &st) == 0 ? UInt64(st.st_ino) : nil
    }
}

/// A process alone in a PID namespace of its own (`unshare --user --map-root-user --pid --fork`),
/// known by its process ID here.
private struct ProcessInOwnPIDNamespace {
    let process = Process()
    let pid: UInt32

    init() throws {
        process.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
        process.arguments = ["--user", "--map-root-user", "--pid", "--fork", "--kill-child", "/bin/sh", "-c",
                             "read -r stat < /proc/self/stat; echo ${stat%% *}; exec sleep 600"]
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let line = try readLine(out.fileHandleForReading)
        pid = UInt32(line) ?? 0
        #expect(pid != 0, "unshare said \(line)")
    }

    func stop() {
        kill(process.processIdentifier, SIGKILL)   // its child, by --kill-child
        process.waitUntilExit()
    }
}
