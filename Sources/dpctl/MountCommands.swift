import ArgumentParser
import DataProtection
import DataProtectionFileSystem
import DataProtectionKeybag
import Foundation

struct Mount: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mount",
        abstract: "Serve protected files to every program (FUSE).",
        usage: "dpctl mount <directory> <mount-point> [--passcode-file F]",
        discussion: """
            Runs until the file system is unmounted (dpctl umount MOUNTPOINT, Ctrl-C, or the end of \
            this process). Through MOUNTPOINT any program reads and writes plaintext; in DIRECTORY \
            every new file is a protected file of its directory's default class, and the classes \
            hold at every call: after lock + grace class-A files refuse opens, reads and writes \
            (EACCES) and their cached pages are dropped; class-B files can be created while locked; \
            nothing of class C opens before the first unlock. The extended attribute \
            user.dataprotection.class is a file's class (setting it rewraps the key) and a \
            directory's default. With keybagd running the mount follows the device's lock state; \
            without it, this process's own: a mount unlocked with --passcode-file never locks until \
            it ends. Needs fuse3 (fusermount3) and /dev/fuse.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The directory of protected files to serve.") var directory: String
    @Argument(help: "Where to mount it (an empty directory).") var mountPoint: String
    @OptionGroup var unlock: UnlockOptions

    func validate() throws { try requirePaths(directory, mountPoint) }

    func run() async throws {
        try MountedFileSystem.checkAvailability()   // what is missing, before any passcode is asked
        let keybag = try await device.openDevice(passcodeFile: unlock.passcodeFile)
        let fileSystem = try ProtectedFileSystem(directory: directory, files: ProtectedFileManager(keybag: keybag))
        let mounted = try fileSystem.mount(at: mountPoint)
        note("serving \(fileSystem.directory) at \(mounted.mountPoint); Ctrl-C or `dpctl umount \(mounted.mountPoint)` ends it"
             + (keybag.daemonSocket == nil ? " (no keybagd: this mount follows this process's lock state, and never locks until it ends)" : ""))
        let signals = TerminationSignals { try? mounted.unmount() }
        defer { signals.cancel() }
        await mounted.serve()
    }
}

struct Unmount: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "umount",
        abstract: "Unmount a protected file system.")

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The mount point.") var mountPoint: String

    func run() async throws {
        try MountedFileSystem.unmount(mountPoint)
    }
}
