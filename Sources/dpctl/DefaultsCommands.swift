import ArgumentParser
import DataProtection
import DataProtectionContainers
import Foundation

/// `dpctl defaults`: an app's or an App Group's preferences, in the shape of macOS's `defaults`.
struct Defaults: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "defaults",
        abstract: "Read, write, delete app or App Group preferences.",
        discussion: """
            DOMAIN is an app's identifier (its Library/Preferences/ID.plist) or an App Group's \
            (group.…: the group container's shared preferences). The property list is a \
            protected file of the container's class: reading or writing it needs that class \
            available (--passcode-file, or a keybagd holding the device unlocked).
            """,
        subcommands: [DefaultsRead.self, DefaultsWrite.self, DefaultsDelete.self])
}

/// Runs `body` on DOMAIN's preferences, opened with the device's keys (not while the app, or a
/// member of the group, runs).
func withPreferences<T>(
    _ device: DeviceOptions, _ unlock: UnlockOptions, domain: String,
    _ body: (ProtectedUserDefaults) async throws -> T
) async throws -> T {
    let manager = try await containerManager(device, passcodeFile: unlock.passcodeFile)
    // Preferences are read whole before any change is written: asking and trying again is safe.
    return try await PasscodePrompt.retrying(manager.files.keybag) {
        try await manager.withPreferences(of: domain, body)
    }
}

/// A string as macOS `defaults read` writes one: bare when it is a plain word, else quoted with
/// `\"`, `\\`, `\n`, `\t`, `\r` and `\Uxxxx` escapes — one value never spans lines or
/// imitates another key.
func quotedPreference(_ string: String) -> String {
    // C0, DEL and C1 (NEL breaks lines, CSI starts terminal escapes), and the line and paragraph separators.
    func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar.value == 0x2028 || scalar.value == 0x2029
    }
    let special: Set<Unicode.Scalar> = [" ", ";", "=", "{", "}", "(", ")", "\"", ",", "\\"]
    guard string.isEmpty || string.unicodeScalars.contains(where: { special.contains($0) || isControl($0) }) else {
        return string
    }
    return quotedEscaping(string, isControl: isControl, control: { "\\U" + String(format: "%04x", $0.value) })
}

/// A property-list value as `defaults read` shows it.
func describePreference(_ value: Any, indent: String = "") -> String {
    switch value {
    case let string as String: return quotedPreference(string)
    case let data as Data:
        return "{length = \(data.count), bytes = 0x\(data.map { String(format: "%02x", $0) }.joined())}"
    case let date as Date: return ISO8601DateFormatter().string(from: date)
    case let bool as Bool: return bool ? "1" : "0"
    case let array as [Any]:
        guard !array.isEmpty else { return "()" }
        return "(\n"
            + array.map { indent + "    " + describePreference($0, indent: indent + "    ") }.joined(separator: ",\n")
            + "\n\(indent))"
    case let dictionary as [String: Any]:
        guard !dictionary.isEmpty else { return "{\n\(indent)}" }
        return "{\n"
            + dictionary.keys.sorted().map { key in
                indent + "    " + describePreference(key) + " = "
                    + describePreference(dictionary[key]!, indent: indent + "    ") + ";"
            }.joined(separator: "\n") + "\n\(indent)}"
    default: return "\(value)"
    }
}

struct DefaultsRead: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "read", abstract: "Print DOMAIN's preferences, or the value of KEY.",
        usage: "dpctl defaults read <domain> [<key>] [<options>]")
    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Argument(help: ArgumentHelp("An app's or an App Group's identifier.", valueName: "domain")) var domain: String
    @Argument(help: ArgumentHelp("The key to print (all when omitted).", valueName: "key")) var key: String?

    func validate() throws { try requireText(domain, key, what: "the domain and key") }

    func run() async throws {
        try await withPreferences(device, unlock, domain: domain) { defaults in
            if let key {
                guard let value = defaults.object(forKey: key) else {
                    throw CLIError("the key \(key) does not exist in \(domain)")
                }
                printOut(describePreference(value))
            } else {
                printOut(describePreference(defaults.dictionaryRepresentation()))
            }
        }
    }
}

struct DefaultsWrite: AsyncParsableCommand {
    enum ValueType: String, ExpressibleByArgument, CaseIterable {
        case string, int, float, bool, data, date, array, dict
    }
    static let configuration = CommandConfiguration(
        commandName: "write",
        abstract: "Set KEY in DOMAIN's preferences.",
        usage: "dpctl defaults write <domain> <key> [<value> ...] [<options>]",
        discussion: """
            VALUE is read as --type says: string (default), int, float, bool (yes/no, true/false, \
            1/0), data (hexadecimal), date (ISO 8601), array (every VALUE, as strings), dict \
            (VALUE pairs: key value key value …).
            """)
    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Argument(help: ArgumentHelp("An app's or an App Group's identifier.", valueName: "domain")) var domain: String
    @Argument(help: ArgumentHelp("The key.", valueName: "key")) var key: String
    @Argument(help: ArgumentHelp("The value (several for array and dict).", valueName: "value")) var values: [String] =
        []
    @Option(help: "How to read VALUE.") var type: ValueType = .string

    func parsedValue() throws -> Any {
        let single: () throws -> String = {
            guard values.count == 1 else { throw ValidationError("--type \(type.rawValue) takes exactly one VALUE") }
            return values[0]
        }
        switch type {
        case .string: return try single()
        case .int:
            guard let value = Int(try single()) else { throw ValidationError("\(values[0]) is not an integer") }
            return value
        case .float:
            guard let value = Double(try single()), value.isFinite else {
                throw ValidationError("\(values[0]) is not a number")
            }
            return value
        case .bool:
            switch try single().lowercased() {
            case "yes", "true", "1": return true
            case "no", "false", "0": return false
            default: throw ValidationError("\(values[0]) is not a boolean (yes/no, true/false, 1/0)")
            }
        case .data:
            let text = try single()
            guard text.count % 2 == 0,
                let bytes = Optional(
                    stride(from: 0, to: text.count, by: 2).compactMap({ i -> UInt8? in
                        let start = text.index(text.startIndex, offsetBy: i)
                        return UInt8(text[start..<text.index(start, offsetBy: 2)], radix: 16)
                    })), bytes.count * 2 == text.count
            else { throw ValidationError("\(text) is not hexadecimal bytes") }
            return Data(bytes)
        case .date:
            guard let date = ISO8601DateFormatter().date(from: try single()) else {
                throw ValidationError("\(values[0]) is not an ISO 8601 date")
            }
            return date
        case .array:
            return values
        case .dict:
            guard values.count % 2 == 0 else { throw ValidationError("--type dict takes key value pairs") }
            return Dictionary(stride(from: 0, to: values.count, by: 2).map { (values[$0], values[$0 + 1]) }) { $1 }
        }
    }

    func validate() throws {
        try requireText(domain, key, what: "the domain and key")
        try requireText(values, what: "a value")
        _ = try parsedValue()
    }

    func run() async throws {
        let value = try parsedValue()
        try await withPreferences(device, unlock, domain: domain) { defaults in
            try defaults.setValue(value, forKey: key)
            try defaults.synchronizeOrThrow()
        }
    }
}

struct DefaultsDelete: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "delete", abstract: "Remove KEY (or every key) from DOMAIN's preferences.",
        usage: "dpctl defaults delete <domain> [<key>] [<options>]")
    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Argument(help: ArgumentHelp("An app's or an App Group's identifier.", valueName: "domain")) var domain: String
    @Argument(help: ArgumentHelp("The key (all when omitted).", valueName: "key")) var key: String?

    func validate() throws { try requireText(domain, key, what: "the domain and key") }

    func run() async throws {
        try await withPreferences(device, unlock, domain: domain) { defaults in
            if let key {
                guard defaults.object(forKey: key) != nil else {
                    throw CLIError("the key \(key) does not exist in \(domain)")
                }
                defaults.removeObject(forKey: key)
            } else {
                for key in defaults.dictionaryRepresentation().keys { defaults.removeObject(forKey: key) }
            }
            try defaults.synchronizeOrThrow()
        }
    }
}
