import Foundation

/// An identifier checked against its rule when made, encoded as its text.
public protocol ValidatedIdentifier: Sendable, Hashable, Comparable, Codable, CustomStringConvertible {
    var rawValue: String { get }
    /// Checks `text` against the identifier's rule (``ContainerError/invalidIdentifier(_:rule:)``).
    init(_ text: String) throws
}

extension ValidatedIdentifier {
    public init(from decoder: any Decoder) throws {
        try self.init(try decoder.singleValueContainer().decode(String.self))
    }
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
    public var description: String { rawValue }
    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// An app's identifier, in reverse-DNS form as iOS bundle identifiers are
/// (`com.example.notes`).
///
/// The rule: two or more parts separated by dots; each part 1–63 characters of ASCII letters,
/// digits and hyphens; 255 bytes at most. Anything else is refused with
/// ``ContainerError/invalidIdentifier(_:rule:)``, which states the rule.
public struct AppIdentifier: ValidatedIdentifier {
    public let rawValue: String

    /// The rule, as error messages and help state it.
    public static let rule =
        "two or more dot-separated parts of ASCII letters, digits and hyphens (each 1-63 characters, 255 in all), like com.example.notes"

    public init(_ text: String) throws {
        guard Self.isReverseDNS(text) else { throw ContainerError.invalidIdentifier(text, rule: Self.rule) }
        guard !text.hasPrefix(AppGroupIdentifier.prefix) else {
            throw ContainerError.invalidIdentifier(
                text, rule: "an app's identifier cannot start with \"group.\" (that prefix names App Groups)")
        }
        rawValue = text
    }

    /// Whether `text` follows ``rule``.
    static func isReverseDNS(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard !bytes.isEmpty, bytes.count <= 255 else { return false }
        let parts = bytes.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count >= 2 else { return false }
        return parts.allSatisfy { part in
            (1...63).contains(part.count)
                && part.allSatisfy { byte in
                    (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5a) || (byte >= 0x61 && byte <= 0x7a)
                        || byte == UInt8(ascii: "-")
                }
        }
    }
}

/// An App Group's identifier: `group.` followed by a reverse-DNS name (`group.com.example.notes`),
/// as the `com.apple.security.application-groups` entitlement lists them on iOS.
public struct AppGroupIdentifier: ValidatedIdentifier {
    public let rawValue: String

    static let prefix = "group."
    /// The rule, as error messages and help state it.
    public static let rule = "\"group.\" followed by a reverse-DNS name, like group.com.example.notes"

    public init(_ text: String) throws {
        guard text.hasPrefix(Self.prefix), AppIdentifier.isReverseDNS(text) else {
            throw ContainerError.invalidIdentifier(text, rule: Self.rule)
        }
        rawValue = text
    }
}
