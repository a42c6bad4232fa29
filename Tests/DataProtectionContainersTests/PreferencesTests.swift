import DataProtection
import DataProtectionContainers
@_spi(Testing) import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Group preferences between two member apps, each in its own sandbox.
@Suite(.serialized) struct PreferencesTests {
    func groupWorld() throws -> AppWorld {
        let world = try AppWorld.make()
        try world.install("com.example.one", ["--group", "group.com.example.prefs"])
        try world.install("com.example.two", ["--group", "group.com.example.prefs"])
        try world.install("com.example.outsider")
        return world
    }

    /// Each `dpctl app run` is its own boot (no keybagd): unlocked with the passcode for class C.
    func unlock(_ world: AppWorld) -> [String] { ["--passcode-file", world.passcode] }

    /// Starts `dpctl app run ID -- dp-test-app ARGS` without waiting for it.
    @Test func twoMemberAppsSettingKeysAtOnceLoseNoUpdate() throws {
        let world = try groupWorld()
        let one = try world.start("com.example.one", ["defaults-hammer", "group.com.example.prefs", "one", "1000"], extra: ["--passcode-file", world.passcode])
        let two = try world.start("com.example.two", ["defaults-hammer", "group.com.example.prefs", "two", "1000"], extra: ["--passcode-file", world.passcode])
        for (process, _) in [one, two] { process.waitUntilExit(); #expect(process.terminationStatus == 0) }
        #expect(try world.testApp("com.example.one", ["defaults-count", "group.com.example.prefs", "one"], extra: unlock(world)).out == "1000\n")
        #expect(try world.testApp("com.example.one", ["defaults-count", "group.com.example.prefs", "two"], extra: unlock(world)).out == "1000\n")
        // Stored as a protected file of the group's class, not as a readable plist.
        let group = try world.groupContainer(of: "com.example.one", "group.com.example.prefs")
        let plist = URL(fileURLWithPath: group + "/Library/Preferences/group.com.example.prefs.plist")
        #expect(try ItemInspector.protection(ofItemAt: plist) == .protected(.completeUntilFirstUserAuthentication))
        #expect(!(try Data(contentsOf: plist)).starts(with: Data("bplist".utf8)))
        // A non-member gets nil for the suite, as it gets nil for the container.
        let outsider = try world.testApp("com.example.outsider", ["defaults-count", "group.com.example.prefs", "one"])
        #expect(outsider.status != 0 && outsider.stderr.contains("usage"))
    }

    @Test func aChangeByOneMemberIsAnnouncedToTheOther() throws {
        let world = try groupWorld()
        let (waiter, out) = try world.start("com.example.two", ["defaults-wait", "group.com.example.prefs", "note", "hello"], extra: ["--passcode-file", world.passcode])
        #expect(try readLine(out.fileHandleForReading) == "waiting")
        #expect(try world.testApp("com.example.one", ["defaults-set", "group.com.example.prefs", "note", "hello"], extra: unlock(world)).out == "set\n")
        waiter.waitUntilExit()
        #expect(waiter.terminationStatus == 0)
        #expect(String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self) == "notified: note = hello\n")
    }

    /// A preferences directory swapped for a link (to another app's, say) is refused, however
    /// deep the link is in the path, and nothing is written through it; a file that another
    /// process replaced since the last write is read again, not overwritten from memory.
    @Test func aLinkedDirectoryIsRefusedAndAnotherWritersFileIsMerged() async throws {
        let dir = temporaryDirectory()
        let keybag = try await Keybag.create(root: dir.appendingPathComponent("root").path, passcode: nil, kdf: .insecureFastForTesting)
        let files = ProtectedFileManager(keybag: keybag)
        let real = dir.appendingPathComponent("real/Preferences"), elsewhere = dir.appendingPathComponent("elsewhere")
        try FileManager.default.createDirectory(at: real, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: elsewhere, withIntermediateDirectories: true)
        let url = real.appendingPathComponent("com.example.plist")
        let one = ProtectedUserDefaults(url: url, files: files), two = ProtectedUserDefaults(url: url, files: files)
        one.set(1, forKey: "a")
        try one.synchronizeOrThrow()
        two.set(2, forKey: "b")
        try two.synchronizeOrThrow()
        one.set(3, forKey: "c")   // `one` last wrote the file; `two` replaced it since
        try one.synchronizeOrThrow()
        let third = ProtectedUserDefaults(url: url, files: files)
        #expect(third.integer(forKey: "a") == 1 && third.integer(forKey: "b") == 2 && third.integer(forKey: "c") == 3)

        // `real` itself becomes a link, one level above the file's directory.
        try FileManager.default.moveItem(at: dir.appendingPathComponent("real"), to: dir.appendingPathComponent("moved"))
        try FileManager.default.createDirectory(at: elsewhere.appendingPathComponent("Preferences"), withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(at: dir.appendingPathComponent("real"), withDestinationURL: elsewhere)
        one.set(4, forKey: "d")
        #expect(throws: ContainerError.self) { try one.synchronizeOrThrow() }
        #expect(!FileManager.default.fileExists(atPath: elsewhere.appendingPathComponent("Preferences/com.example.plist").path))
    }

    /// A write is visible at once and flushed later (within a second, or when the defaults go
    /// away); meanwhile the last flushed version is kept, and a plist a power cut left torn is
    /// restored from it, with its class — the unflushed writes are lost, never the file. Without
    /// a kept version a torn plist is an error and is left as it is.
    @Test func aPowerCutBeforeTheFlushLosesOnlyTheUnflushedWritesNeverTheFile() async throws {
        let dir = temporaryDirectory()
        let keybag = try await Keybag.create(root: dir.appendingPathComponent("root").path, passcode: nil, kdf: .insecureFastForTesting)
        let files = ProtectedFileManager(keybag: keybag)
        let fm = FileManager.default
        let preferences = dir.appendingPathComponent("Preferences")
        try fm.createDirectory(at: preferences, withIntermediateDirectories: true)
        try await files.setProtection(.complete, ofItemAt: preferences)   // not the default class
        let url = preferences.appendingPathComponent("com.example.plist")
        let keptName = ".com.example.plist.durable"
        let kept = preferences.appendingPathComponent(keptName)
        // An hour: nothing is flushed by the clock during the test, only by what it does.
        func open(_ url: URL) -> ProtectedUserDefaults { ProtectedUserDefaults(url: url, files: files, flushDelay: 3600) }

        var defaults: ProtectedUserDefaults? = open(url)
        defaults!.set(1, forKey: "a")
        try defaults!.synchronizeOrThrow()
        #expect(!fm.fileExists(atPath: kept.path))   // a first file is flushed at once
        let flushed = try Data(contentsOf: url)
        defaults!.set(2, forKey: "a")
        try defaults!.synchronizeOrThrow()
        defaults!.set(3, forKey: "a")
        try defaults!.synchronizeOrThrow()
        // Not flushed yet: the flushed version is kept, byte for byte, with its class.
        #expect(try Data(contentsOf: kept) == flushed)
        #expect(try ItemInspector.protection(ofItemAt: kept) == .protected(.complete))

        // The disk as a power cut now could leave it: the newest plist torn (zeros, or cut
        // short), or whole; the kept one whole.
        enum Tear { case zeros, halfZeros, none }
        func crashedCopy(_ tear: Tear, keeping: Bool) async throws -> URL {
            let copy = dir.appendingPathComponent("after-\(UUID().uuidString.prefix(8))/Preferences")
            try fm.createDirectory(at: copy, withIntermediateDirectories: true)
            try await files.setProtection(.complete, ofItemAt: copy)
            var bytes = try Data(contentsOf: url)
            switch tear {
            case .zeros: bytes = Data(count: bytes.count)
            case .halfZeros: bytes = bytes.prefix(bytes.count / 2) + Data(count: bytes.count - bytes.count / 2)
            case .none: break
            }
            try bytes.write(to: copy.appendingPathComponent("com.example.plist"))
            if keeping { try fm.copyItem(at: kept, to: copy.appendingPathComponent(keptName)) }
            return copy
        }
        for tear in [Tear.zeros, .halfZeros] {
            let torn = try await crashedCopy(tear, keeping: true)
            let plist = torn.appendingPathComponent("com.example.plist")
            let restored = open(plist)
            #expect(restored.integer(forKey: "a") == 1, "\(tear)")
            #expect(!fm.fileExists(atPath: torn.appendingPathComponent(keptName).path))
            #expect(try ItemInspector.protection(ofItemAt: plist) == .protected(.complete))
            #expect(try Data(contentsOf: plist) == flushed)
        }
        // Whole (the writes had reached the disk): the newest is read; the kept copy is dropped
        // once the plist is flushed — here when the defaults go away.
        let whole = try await crashedCopy(.none, keeping: true)
        var survivor: ProtectedUserDefaults? = open(whole.appendingPathComponent("com.example.plist"))
        #expect(survivor!.integer(forKey: "a") == 3)
        #expect(fm.fileExists(atPath: whole.appendingPathComponent(keptName).path))
        survivor = nil
        #expect(!fm.fileExists(atPath: whole.appendingPathComponent(keptName).path))
        // Torn with nothing kept: an error, and the file is not overwritten.
        let lost = try await crashedCopy(.zeros, keeping: false)
        let lostBytes = try Data(contentsOf: lost.appendingPathComponent("com.example.plist"))
        let refused = open(lost.appendingPathComponent("com.example.plist"))
        refused.set(4, forKey: "a")
        #expect(throws: (any Error).self) { try refused.synchronizeOrThrow() }
        #expect(try Data(contentsOf: lost.appendingPathComponent("com.example.plist")) == lostBytes)

        // A second writer beside the first one's kept version flushes the plist before replacing
        // it: the version kept is then the newest the first one wrote (a = 3), not the older one.
        var second: ProtectedUserDefaults? = open(url)
        second!.set(5, forKey: "b")
        try second!.synchronizeOrThrow()
        #expect(try Data(contentsOf: kept) != flushed)
        // Both let go (the first flushes the second's plist if its watcher read it whole first,
        // else leaves it to the second): flushed, the kept version dropped, the newest values there.
        defaults = nil
        second = nil
        #expect((try fm.contentsOfDirectory(atPath: preferences.path)).filter { !$0.hasSuffix(".lock") } == ["com.example.plist"])
        let last = open(url)
        #expect(last.integer(forKey: "a") == 3 && last.integer(forKey: "b") == 5)
    }

    /// Another writer's version that looks like the one this process knows — the same inode
    /// number (ext4 gives a freed one to the next file at once), size and modification time — is
    /// still read before a write merges into it: the known version is held open, so its number
    /// goes to no other file, and the other writer's value is never reverted.
    @Test func aVersionThatLooksLikeTheKnownOneIsReadBeforeAWrite() async throws {
        let dir = temporaryDirectory()
        let keybag = try await Keybag.create(root: dir.appendingPathComponent("root").path, passcode: nil, kdf: .insecureFastForTesting)
        let files = ProtectedFileManager(keybag: keybag)
        let url = dir.appendingPathComponent("com.example.plist")
        func plist(_ value: String) throws -> Data {
            try PropertyListSerialization.data(fromPropertyList: ["a": value], format: .binary, options: 0)
        }
        func status() throws -> stat {
            var st = stat()
            guard lstat(url.path, &st) == 0 else { throw CocoaError(.fileNoSuchFile) }
            return st
        }
        for round in 0..<20 {
            let one = ProtectedUserDefaults(url: url, files: files)
            one.set("x0", forKey: "a")
            try one.synchronizeOrThrow()
            let known = try status()
            // A value is set while another writer holds the file's lock (the write waits for
            // it). That writer replaces the file twice (the first replacement frees the known
            // inode, the second is made after), gives it the known modification time and lets go.
            let lock = open(dir.appendingPathComponent(".com.example.plist.lock").path, O_RDWR | O_CLOEXEC)
            #expect(lock >= 0 && flock(lock, LOCK_EX) == 0)
            one.set("mine", forKey: "b")
            try await files.write(try plist("x1"), to: url, protection: nil)
            try await files.write(try plist("x\(round % 8 + 2)"), to: url, protection: nil)
            var times = [known.st_atim, known.st_mtim]
            #expect(utimensat(AT_FDCWD, url.path, &times, AT_SYMLINK_NOFOLLOW) == 0)
            let now = try status()
            #expect(now.st_size == known.st_size && now.st_mtim.tv_nsec == known.st_mtim.tv_nsec)
            #expect(now.st_ino != known.st_ino, "the known version's inode number went to another file")
            close(lock)
            try one.synchronizeOrThrow()
            let reader = ProtectedUserDefaults(url: url, files: files)
            #expect(reader.string(forKey: "a") == "x\(round % 8 + 2)", "round \(round): the other writer's value was reverted")
            #expect(reader.string(forKey: "b") == "mine")
            try FileManager.default.removeItem(at: url)
        }
    }

    /// A process holding the file's lock (another app of a shared App Group, say) cannot hold
    /// this one up for good when its defaults go away or it exits: the lock is waited for a
    /// bounded time, and the file is left as it was.
    @Test func aLockHeldElsewhereDoesNotHoldUpTheDefaultsGoingAway() async throws {
        let dir = temporaryDirectory()
        let keybag = try await Keybag.create(root: dir.appendingPathComponent("root").path, passcode: nil, kdf: .insecureFastForTesting)
        let files = ProtectedFileManager(keybag: keybag)
        let url = dir.appendingPathComponent("com.example.plist")
        do {
            let defaults = ProtectedUserDefaults(url: url, files: files)
            defaults.set("kept", forKey: "a")
            try defaults.synchronizeOrThrow()
        }
        let lock = open(dir.appendingPathComponent(".com.example.plist.lock").path, O_RDWR | O_CLOEXEC)
        defer { close(lock) }
        #expect(lock >= 0 && flock(lock, LOCK_EX) == 0)
        let done = DispatchSemaphore(value: 0)
        Thread {
            do {
                let defaults = ProtectedUserDefaults(url: url, files: files, flushDelay: 1, finishingTimeLimit: 0.2)
                defaults.set("later", forKey: "b")
            }
            done.signal()
        }.start()
        // A bound for the failure only: the defaults go away after 0.2 s, never after this.
        #expect(done.wait(timeout: .now() + 60) == .success, "the defaults going away waited for the lock")
        flock(lock, LOCK_UN)
        #expect(ProtectedUserDefaults(url: url, files: files).string(forKey: "a") == "kept")
    }

    /// A value set and never synchronized is written when the defaults go away (as on iOS,
    /// where it reaches `cfprefsd` at once): the next reader finds it, every time.
    @Test func aValueSetIsWrittenWhenTheDefaultsGoAway() async throws {
        let dir = temporaryDirectory()
        let keybag = try await Keybag.create(root: dir.appendingPathComponent("root").path, passcode: nil, kdf: .insecureFastForTesting)
        let files = ProtectedFileManager(keybag: keybag)
        let url = dir.appendingPathComponent("com.example.plist")
        for round in 0..<200 {
            do {
                let defaults = ProtectedUserDefaults(url: url, files: files)
                defaults.set(round, forKey: "round")
            }
            #expect(ProtectedUserDefaults(url: url, files: files).integer(forKey: "round") == round)
        }
        // What a writer killed mid-write left beside the plist (a version replaced and not yet
        // removed, say, holding a value removed since) goes at the next write; nothing else does.
        let leftover = dir.appendingPathComponent(".com.example.plist.dp-tmp-5eed").path
        let other = dir.appendingPathComponent(".other.plist.dp-tmp-5eed").path
        for path in [leftover, other] { #expect(FileManager.default.createFile(atPath: path, contents: Data("old".utf8))) }
        let defaults = ProtectedUserDefaults(url: url, files: files)
        defaults.set(true, forKey: "written")
        #expect(defaults.synchronize())
        #expect(!FileManager.default.fileExists(atPath: leftover) && FileManager.default.fileExists(atPath: other))
    }

    @Test func theUserDefaultsShapeBehavesAsFoundations() async throws {
        let dir = temporaryDirectory()
        let keybag = try await Keybag.create(root: dir.appendingPathComponent("root").path, passcode: nil, kdf: .insecureFastForTesting)
        let files = ProtectedFileManager(keybag: keybag)
        let url = dir.appendingPathComponent("com.example.plist")
        let defaults = ProtectedUserDefaults(url: url, files: files)
        defaults.register(defaults: ["theme": "light", "count": 1])
        #expect(defaults.string(forKey: "theme") == "light" && defaults.integer(forKey: "count") == 1)
        defaults.set("dark", forKey: "theme")
        defaults.set(42, forKey: "count")
        defaults.set(true, forKey: "flag")
        defaults.set(2.5, forKey: "ratio")
        defaults.set(Data([1, 2, 3]), forKey: "blob")
        defaults.set(["a", "b"], forKey: "list")
        defaults.set(["k": "v"], forKey: "dict")
        defaults.set("YES", forKey: "yes")
        #expect(throws: ContainerError.self) { try defaults.setValue(NSObject(), forKey: "bad") }
        #expect(defaults.synchronize())
        // A second reader of the same file sees everything, typed.
        let again = ProtectedUserDefaults(url: url, files: files)
        #expect(again.string(forKey: "theme") == "dark")
        #expect(again.integer(forKey: "count") == 42 && again.bool(forKey: "flag") && again.double(forKey: "ratio") == 2.5)
        #expect(again.data(forKey: "blob") == Data([1, 2, 3]))
        #expect(again.stringArray(forKey: "list") == ["a", "b"])
        #expect(again.dictionary(forKey: "dict") as? [String: String] == ["k": "v"])
        #expect(again.bool(forKey: "yes") && again.object(forKey: "bad") == nil)
        again.removeObject(forKey: "theme")
        #expect(again.synchronize())
        #expect(ProtectedUserDefaults(url: url, files: files).object(forKey: "theme") == nil)
        #expect(Set(again.dictionaryRepresentation().keys) == ["count", "flag", "ratio", "blob", "list", "dict", "yes"])
    }
}

/// `dpctl defaults`, against what apps write from inside their sandbox.
@Suite(.serialized) struct DefaultsCommandTests {
    @Test func readWriteDeleteAppAndGroupDomains() throws {
        let world = try AppWorld.make()
        try world.install("com.example.one", ["--group", "group.com.example.prefs"])
        let unlock = ["--passcode-file", world.passcode]
        #expect(try world.dpctl(["defaults", "write", "com.example.one", "theme", "dark"] + unlock).status == 0)
        #expect(try world.dpctl(["defaults", "write", "com.example.one", "count", "42", "--type", "int"] + unlock).status == 0)
        #expect(try world.dpctl(["defaults", "write", "group.com.example.prefs", "tags", "a", "b", "--type", "array"] + unlock).status == 0)
        #expect(try world.dpctl(["defaults", "read", "com.example.one", "count"] + unlock).out == "42\n")
        #expect(try world.dpctl(["defaults", "read", "com.example.one"] + unlock).out == "{\n    count = 42;\n    theme = dark;\n}\n")
        #expect(try world.dpctl(["defaults", "read", "group.com.example.prefs", "tags"] + unlock).out == "(\n    a,\n    b\n)\n")
        // What an app sets in the group, dpctl reads; what dpctl wrote, the app sees.
        #expect(try world.testApp("com.example.one", ["defaults-set", "group.com.example.prefs", "note", "from the app"], extra: unlock).status == 0)
        #expect(try world.dpctl(["defaults", "read", "group.com.example.prefs", "note"] + unlock).out == "\"from the app\"\n")
        // Set with no synchronize by an app that exits at once: written all the same.
        for value in ["first", "second", "third"] {
            #expect(try world.testApp("com.example.one", ["defaults-set", "com.example.one", "quick", value, "--exit-at-once"], extra: unlock).status == 0)
            #expect(try world.dpctl(["defaults", "read", "com.example.one", "quick"] + unlock).out == "\(value)\n")
        }
        #expect(try world.dpctl(["defaults", "delete", "com.example.one", "theme"] + unlock).status == 0)
        let missing = try world.dpctl(["defaults", "read", "com.example.one", "theme"] + unlock)
        #expect(missing.status == 1 && missing.stderr == "dpctl: the key theme does not exist in com.example.one\n")
        // Locked: the class is unavailable — exit 3, nothing changed.
        let locked = try world.dpctl(["defaults", "read", "com.example.one"])
        #expect(locked.status == 3 && locked.stderr.split(separator: "\n").count == 1)
        #expect(try world.dpctl(["defaults", "write", "com.example.one", "x", "nan", "--type", "float"] + unlock).status == 64)
        #expect(try world.dpctl(["defaults", "read", "com.example.unknown"] + unlock).stderr == "dpctl: no app com.example.unknown is installed\n")
    }
}
