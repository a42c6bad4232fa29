import ArgumentParser
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSharing
import Foundation

struct Share: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "share",
        abstract: "Share files between apps, as the user does on iOS.",
        subcommands: [ShareOpenIn.self])
}

struct ShareOpenIn: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "open-in",
        abstract: "Copy an app's file into another app's Documents/Inbox (Open in…).",
        discussion: """
            The recipient gets its own copy, under a name made safe from FILE's, with a number \
            rather than replacing anything; the sender's later changes never reach it. The copy \
            is protected with the stronger of FILE's class and the recipient's default, under a \
            new key. A class-A file cannot be sent while the device is locked (exit 3). The \
            recipient is told now if it runs, else at its next launch. FILE is a path in the \
            sender's container (relative to it, or absolute) or in one of its groups'; links, \
            directories, FIFOs and devices are refused.
            """)

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Option(help: ArgumentHelp("The sending app.", valueName: "id")) var from: String
    @Option(help: ArgumentHelp("The receiving app.", valueName: "id")) var to: String
    @Argument(help: ArgumentHelp("The file, in the sending app's container.", valueName: "file")) var file: String

    func run() async throws {
        let broker = SharingBroker(manager: try await containerManager(device, passcodeFile: unlock.passcodeFile))
        let copy = try await broker.openIn(file, from: try appIdentifier(from), to: try appIdentifier(to))
        printOut("sent to \(copy.recipient): \(copy.url.path) (class \(copy.protection.shortName))")
    }
}
