import ArgumentParser
import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSharing
import DataProtectionSystem
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
        abstract: "Copy a file into another app's Inbox (Open in…).",
        usage: "dpctl share open-in --from <id> --to <id> <file> [<options>]",
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
        let (sender, recipient) = (try appIdentifier(from), try appIdentifier(to))
        // The sender's file is opened before anything is written into the recipient's Inbox.
        let copy = try await PasscodePrompt.retrying(broker.manager.files.keybag) {
            try await broker.openIn(file, from: sender, to: recipient)
        }
        printOut("sent to \(copy.recipient): \(copy.url.path) (class \(copy.protection.shortName))")
    }
}

struct GrantCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "grant",
        abstract: "Grant an app access to another app's item.",
        discussion: """
            ITEM is a path in the providing app's Documents (relative to its container, or \
            absolute); the provider must have been installed with --document-browser, which \
            exposes its Documents (never Documents/Inbox). The capabilities are enforced: \
            without --write the recipient gets read-only descriptors. Without --persistent the \
            grant ends when the recipient's current (or next) run ends. Prints the grant's ID.
            """)

    @OptionGroup var device: DeviceOptions
    @Option(help: ArgumentHelp("The providing app.", valueName: "id")) var from: String
    @Option(help: ArgumentHelp("The receiving app.", valueName: "id")) var to: String
    @Argument(help: ArgumentHelp("The item, in the providing app's Documents.", valueName: "item")) var item: String
    @Flag(help: "Let it read (the default when no capability is given).") var read = false
    @Flag(help: "Let it write the item in place.") var write = false
    @Flag(help: "Let it rename the item.") var rename = false
    @Flag(help: "Let it delete the item.") var delete = false
    @Flag(help: "Let it add items below a granted directory.") var add = false
    @Flag(help: "Let it list a granted directory.") var enumerate = false
    @Option(help: ArgumentHelp("End the grant after this long (30s, 10m, 2h, 7d).", valueName: "duration")) var expires:
        String?
    @Flag(help: "Keep the grant across the recipient's launches.") var persistent = false

    func validate() throws { _ = try expires.map(parseDuration) }

    func run() async throws {
        var capabilities: GrantCapabilities = []
        for (flag, capability) in [
            (read, GrantCapabilities.reading), (write, .writing), (rename, .renaming), (delete, .deleting),
            (add, .addingSubItems), (enumerate, .contentEnumerating),
        ] where flag { capabilities.insert(capability) }
        if capabilities.isEmpty { capabilities = .reading }
        let lifetime = try expires.map(parseDuration)
        let broker = SharingBroker(manager: try await containerManager(device))
        let grant = try broker.grant(
            item, from: try appIdentifier(from), to: try appIdentifier(to), capabilities: capabilities,
            expiresAfter: lifetime, persistent: persistent, by: .user)
        printOut(grant.id.uuidString)
    }
}

/// `30s`, `10m`, `2h`, `7d`, or plain seconds.
func parseDuration(_ text: String) throws -> TimeInterval {
    let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86400]
    let (number, unit) = text.last.flatMap { units[$0] }.map { (String(text.dropLast()), $0) } ?? (text, 1)
    guard let value = Double(number), value > 0, value.isFinite else {
        throw ValidationError("\(text) is not a duration (examples: 30s, 10m, 2h, 7d)")
    }
    return value * unit
}

struct Grants: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "grants",
        abstract: "List grants (all, or those an app gave or received).")

    @OptionGroup var device: DeviceOptions
    @Option(help: ArgumentHelp("Only grants this app gave or received.", valueName: "id")) var app: String?
    @Flag(help: "Print JSON.") var json = false

    struct Entry: Encodable {
        var id: String, provider: String, item: String, recipient: String, capabilities: [String]
        var expires: String?, persistent: Bool, expired: Bool
    }

    func run() async throws {
        let broker = SharingBroker(manager: try await containerManager(device))
        let now = broker.manager.files.keybag.clock.now()
        let entries = broker.grants(involving: try app.map(appIdentifier)).map { g in
            Entry(
                id: g.id.uuidString, provider: g.provider, item: g.path, recipient: g.recipient,
                capabilities: g.capabilities.description.split(separator: ",").map(String.init),
                expires: g.expires.map { ISO8601DateFormatter().string(from: $0) }, persistent: g.persistent,
                expired: g.isExpired(at: now))
        }
        if json { return printJSON(entries) }
        for e in entries {
            let lifetime = e.expired ? "expired" : e.expires.map { "until \($0)" } ?? "until revoked"
            printOut(
                "\(e.id)  \(e.provider):\(LosslessPath.display(e.item)) -> \(e.recipient)  \(e.capabilities.joined(separator: ","))  \(lifetime)\(e.persistent ? ", persistent" : "")"
            )
        }
    }
}

struct Revoke: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "revoke",
        abstract: "End a grant (open descriptors stay valid).",
        discussion: "No new access starts; descriptors already open stay valid until they are closed.")

    @OptionGroup var device: DeviceOptions
    @Argument(help: ArgumentHelp("The grant's ID.", valueName: "grant-id")) var grant: String

    func run() async throws {
        guard let id = UUID(uuidString: grant) else {
            throw ValidationError("\(grant) is not a grant ID (dpctl grants lists them)")
        }
        try SharingBroker(manager: try await containerManager(device)).revoke(id)
        printOut("revoked \(id)")
    }
}
