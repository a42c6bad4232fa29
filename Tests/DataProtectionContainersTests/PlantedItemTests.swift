import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// What an app plants in its own container or a group's — links, FIFOs, odd modes, deep trees —
/// to make the tools and the other apps outside its sandbox act for it. Each was an attack that
/// worked before its fix.
@Suite(.serialized) struct PlantedItemTests {
    @Test func reprotectionFollowsNoLinkAnAppPlanted() throws {
        let world = try AppWorld.make()
        let a = try world.install("com.example.a")
        let root = world.cli.root
        // From inside: links to the device secret and keybag (the app knows the root's path from
        // its own container's path).
        let plant = try world.shell("com.example.a", "ln -s '\(root)/device.secret' Documents/secret && ln -s '\(root)/keybag' Documents/keybag && echo planted")
        #expect(plant.out == "planted\n", "\(plant.stderr)")
        let run = try world.dpctl(["app", "set-protection", "com.example.a", "none", "--reprotect", "--passcode-file", world.passcode])
        #expect(run.status == 0, "\(run.stderr)")
        // Still links: nothing was copied into the container.
        for name in ["secret", "keybag"] {
            #expect(try FileManager.default.destinationOfSymbolicLink(atPath: a + "/Documents/" + name).hasPrefix(root))
        }
        let read = try world.testApp("com.example.a", ["read", a + "/Documents/secret"], extra: ["--passcode-file", world.passcode])
        #expect(read.status != 0)
    }

    @Test func preferencesFollowNoLinkAndReadNoFIFO() throws {
        let world = try AppWorld.make()
        let a = try world.install("com.example.a", ["--group", "group.com.example.g"])
        let b = try world.install("com.example.b", ["--group", "group.com.example.g"])
        let unlock = ["--passcode-file", world.passcode]
        #expect(try world.dpctl(["defaults", "write", "com.example.b", "secret", "hunter2"] + unlock).status == 0)
        let bPlist = b + "/Library/Preferences/com.example.b.plist"

        // A's own plist, a link to B's (found through its own cwd trick or a known path).
        _ = try world.shell("com.example.a", "ln -s '\(bPlist)' Library/Preferences/com.example.a.plist")
        let read = try world.dpctl(["defaults", "read", "com.example.a"] + unlock)
        #expect(read.status == 1 && !read.out.contains("hunter2") && read.stderr.contains("refused"), "\(read.out) \(read.stderr)")

        // The group's plist, a link to B's private one: B's next group write must not merge it.
        let group = try world.groupContainer(of: "com.example.a", "group.com.example.g")
        _ = try world.shell("com.example.a", "ln -s /proc/self/cwd/Library/Preferences/com.example.b.plist '\(group)/Library/Preferences/group.com.example.g.plist'")
        let merged = try world.testApp("com.example.b", ["defaults-set", "group.com.example.g", "shared", "1"], extra: unlock)
        #expect(merged.status != 0)
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: group + "/Library/Preferences/group.com.example.g.plist").hasPrefix("/proc"))

        // A FIFO where the plist belongs (an app can no longer make one there: planted from outside,
        // as any other program of the user could): refused at once, not a hang.
        let appMade = try world.shell("com.example.a", "rm -f Library/Preferences/com.example.a.plist && mkfifo Library/Preferences/com.example.a.plist")
        #expect(appMade.status != 0, "the app made a FIFO among its data")
        #expect(mkfifo(a + "/Library/Preferences/com.example.a.plist", 0o600) == 0)
        let fifo = try world.dpctl(["defaults", "read", "com.example.a"] + unlock)
        #expect(fifo.status == 1 && fifo.stderr.contains("not a regular file"), "\(fifo.stderr)")

        // Preferences directory replaced by a link out: nothing is written where it points.
        let victim = world.cli.work.appendingPathComponent("victim").path
        try FileManager.default.createDirectory(atPath: victim, withIntermediateDirectories: true)
        _ = try world.shell("com.example.a", "rm -rf Library/Preferences && ln -s '\(victim)' Library/Preferences")
        let write = try world.dpctl(["defaults", "write", "com.example.a", "k", "v"] + unlock)
        #expect(write.status == 1)
        #expect(try FileManager.default.contentsOfDirectory(atPath: victim).isEmpty)
    }

    @Test func anAppCannotLockItselfOrOthersOutWithChmod() throws {
        let world = try AppWorld.make()
        let a = try world.install("com.example.a", ["--group", "group.com.example.g"])
        try world.install("com.example.b", ["--group", "group.com.example.g"])
        let group = try world.groupContainer(of: "com.example.a", "group.com.example.g")
        #expect(try world.shell("com.example.a", "chmod 000 '\(group)' && chmod 300 . && echo done").out == "done\n")
        // The next launch gives the roots their mode back; B reaches the group.
        let b = try world.shell("com.example.b", "touch '\(group)/hello' && echo ok")
        #expect(b.out == "ok\n", "\(b.stderr)")
        _ = try world.shell("com.example.a", "chmod 000 .")
        #expect(try world.dpctl(["app", "uninstall", "com.example.a"]).status == 0)
        #expect(!FileManager.default.fileExists(atPath: a))
    }

    @Test func uninstallRemovesTreesTooDeepForAPath() throws {
        let world = try AppWorld.make()
        let a = try world.install("com.example.a")
        // Nested by renames (no path ever gets long), 20 levels of 250-byte names: deeper than
        // PATH_MAX, with a file at the bottom and the top made unreadable.
        let name = String(repeating: "d", count: 250)
        let deep = try world.shell("com.example.a", "mkdir Documents/t && echo x > Documents/t/leaf && i=0; while [ $i -lt 20 ]; do mkdir Documents/n && mv Documents/t Documents/n/\(name) && mv Documents/n Documents/t || exit 1; i=$((i+1)); done; chmod 000 Documents/t; echo built")
        #expect(deep.out == "built\n", "\(deep.stderr)")
        let removed = try world.dpctl(["app", "uninstall", "com.example.a"])
        #expect(removed.status == 0, "\(removed.stderr)")
        #expect(!FileManager.default.fileExists(atPath: a))
        #expect(try FileManager.default.contentsOfDirectory(atPath: world.cli.root + "/Containers/Data/Application").isEmpty)
    }

    @Test func aProgramInsideAContainerIsNotRunAsAnApp() throws {
        let world = try AppWorld.make()
        let a = try world.install("com.example.a")
        try FileManager.default.copyItem(atPath: "/bin/true", toPath: a + "/Documents/tool")
        let run = try world.dpctl(["app", "run", "com.example.a", "--", a + "/Documents/tool"])
        #expect(run.status == 1 && run.stderr.contains("inside a container"), "\(run.stderr)")
    }
}
