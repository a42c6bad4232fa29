import DataProtectionSystem
import Foundation

/// The name a shared file gets in the recipient's Inbox, made by the broker from the sender's
/// display name — never trusted as given (Dirty Stream, Zip Slip; FORMAT.md §11.2):
///
/// - bytes that are not UTF-8 (and U+FFFD, which they become in transit), private-use code points
///   and noncharacters become `_`;
/// - separators (`/`, `\`), control characters (C0, DEL, C1), line and paragraph separators and
///   format characters (bidirectional overrides, which make `txt.exe` read as `exe.txt`;
///   zero-width characters; the BOM) are removed;
/// - every `..` is removed, then leading dots, spaces and combining marks, and trailing dots and
///   spaces;
/// - the result is cut to at most ``maxBytes`` bytes of UTF-8 at a character boundary, keeping
///   a short extension; an empty result is `Untitled`;
/// - a name taken in the Inbox gets a number: `name 2.ext`, `name 3.ext`… (nothing is replaced).
///
/// ```swift
/// InboxName("../../x.txt").candidate(1)    // "x.txt"
/// InboxName("report.pdf").candidate(2)     // "report 2.pdf"
/// ```
public struct InboxName: Sendable, Equatable {
    /// The cleaned name, without a number.
    public let base: String
    /// The extension (without its dot), or "".
    public let pathExtension: String

    /// Room left below NAME_MAX (255) for " 10000".
    public static let maxBytes = 240
    static let placeholder = "Untitled"

    /// Cleans a display name given as bytes (a file name on Linux is bytes).
    public init(bytes: [UInt8]) {
        self.init(String(decoding: bytes, as: UTF8.self))
    }

    /// Cleans a display name; U+FFFD (what undecodable bytes became on the way) turns into `_`.
    public init(_ displayName: String) {
        var scalars = String.UnicodeScalarView()
        for scalar in displayName.unicodeScalars where !Self.isRemoved(scalar) {
            scalars.append(Self.isReplaced(scalar) ? "_" : scalar)
        }
        var name = String(scalars)
        while name.contains("..") { name = name.replacingOccurrences(of: "..", with: "") }
        // Leading dots, spaces and combining marks go by code point: "." + U+0301 is one
        // Character, and must not keep the name hidden.
        name = String(
            String.UnicodeScalarView(
                name.unicodeScalars.drop { $0 == "." || $0.properties.isWhitespace || Self.isMark($0) }))
        while let last = name.last, last == "." || last.isWhitespace { name.removeLast() }
        if name.isEmpty { name = Self.placeholder }

        var ext = ""
        var stem = name
        if let dot = name.lastIndex(of: "."), dot != name.startIndex {
            let candidate = String(name[name.index(after: dot)...])
            if !candidate.isEmpty, candidate.utf8.count <= 16 {
                ext = candidate
                stem = String(name[..<dot])
            }
        }
        let room = Self.maxBytes - (ext.isEmpty ? 0 : ext.utf8.count + 1)
        stem = Self.prefix(of: stem, maxBytes: room)
        while let last = stem.last, last == "." || last.isWhitespace { stem.removeLast() }
        if stem.isEmpty { stem = Self.placeholder }
        base = stem
        pathExtension = ext
    }

    /// The `n`th candidate: the name itself for 1, then `base n.ext`.
    public func candidate(_ n: Int) -> String {
        let stem = n <= 1 ? base : "\(base) \(n)"
        return pathExtension.isEmpty ? stem : stem + "." + pathExtension
    }

    private static func isRemoved(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x7F...0x9F: return true   // control characters
        case 0x2F, 0x5C: return true   // "/" and "\"
        case 0x2028, 0x2029: return true   // line and paragraph separators
        default: return scalar.properties.generalCategory == .format   // bidirectional controls, zero-width, BOM…
        }
    }

    /// Private-use code points (which `LosslessPath` uses for raw bytes: the name on disk would
    /// not be the path the recipient is given), noncharacters and U+FFFD become `_`.
    private static func isReplaced(_ scalar: Unicode.Scalar) -> Bool {
        scalar == "\u{FFFD}" || scalar.properties.generalCategory == .privateUse
            || scalar.properties.isNoncharacterCodePoint
    }

    private static func isMark(_ scalar: Unicode.Scalar) -> Bool {
        [.nonspacingMark, .spacingMark, .enclosingMark].contains(scalar.properties.generalCategory)
    }

    /// The longest prefix of `text` of at most `maxBytes` UTF-8 bytes, cut between characters.
    private static func prefix(of text: String, maxBytes: Int) -> String {
        guard text.utf8.count > maxBytes else { return text }
        var result = ""
        var used = 0
        for character in text {
            let size = character.utf8.count
            if used + size > maxBytes { break }
            result.append(character)
            used += size
        }
        return result
    }
}
