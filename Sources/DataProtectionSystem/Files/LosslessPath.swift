import Foundation

/// File names are bytes on Linux; Swift strings are Unicode. This is the one lossless mapping
/// between the two that the whole package uses, so `lat\xE9` and `y\xFE` / `y\xFD` stay three
/// different names from `argv` to the file system, into a backup manifest and back.
///
/// Valid UTF-8 maps to itself. Each byte of a sequence that is not valid UTF-8 maps to the
/// scalar `U+10FF00 + byte` (bytes `0x80…0xFF` → `U+10FF80…U+10FFFF`, plane 16's private-use
/// area) — the idea of Python's `surrogateescape`, with scalars Swift strings can hold. A name
/// that itself contains one of those 128 scalars has its bytes escaped the same way, so the
/// mapping is injective: ``bytes(of:)`` always gives back the bytes ``string(fromBytes:)`` saw.
///
/// ```swift
/// let name = LosslessPath.string(fromBytes: [0x6C, 0x61, 0x74, 0xE9])   // "lat" + U+10FFE9
/// LosslessPath.bytes(of: name)                                          // [0x6C, 0x61, 0x74, 0xE9]
/// try LosslessPath.withCString(name) { open($0, O_RDONLY) }             // opens `lat\xE9`
/// LosslessPath.display(name)                                            // "lat\xE9", for messages
/// ```
public enum LosslessPath {
    static let escapeBase: UInt32 = 0x10FF00
    static let escapeRange: ClosedRange<UInt32> = 0x10FF80...0x10FFFF

    /// The string for a name or path read from the system (`readdir`, `argv`, `readlink`).
    public static func string(fromBytes bytes: some Collection<UInt8>) -> String {
        let bytes = Array(bytes)
        // The common case: valid UTF-8 without escape-range scalars is itself.
        if let plain = String(validating: bytes, as: UTF8.self),
            !plain.unicodeScalars.contains(where: { escapeRange.contains($0.value) })
        {
            return plain
        }
        var scalars = String.UnicodeScalarView()
        var index = 0
        while index < bytes.count {
            let length = validSequenceLength(bytes, at: index)
            if length > 0,
                let scalar = String(validating: bytes[index..<index + length], as: UTF8.self)?.unicodeScalars.first,
                !escapeRange.contains(scalar.value)
            {
                scalars.append(scalar)
                index += length
            } else {
                // An invalid byte, or one byte of a scalar that would read as an escape.
                let count = max(length, 1)
                for byte in bytes[index..<index + count] { scalars.append(Unicode.Scalar(escapeBase + UInt32(byte))!) }
                index += count
            }
        }
        return String(scalars)
    }

    /// The bytes the system must see for `string` (the inverse of ``string(fromBytes:)``).
    public static func bytes(of string: String) -> [UInt8] {
        // The common case, without a scalar of the escape range (UTF-8 F4 8F BE/BF …): the
        // string's own UTF-8, with no work per character.
        if !string.utf8.contains(0xF4) { return Array(string.utf8) }
        var out: [UInt8] = []
        out.reserveCapacity(string.utf8.count)
        for scalar in string.unicodeScalars {
            if escapeRange.contains(scalar.value) {
                out.append(UInt8(scalar.value - escapeBase))
            } else {
                out.append(contentsOf: String(scalar).utf8)
            }
        }
        return out
    }

    /// Calls `body` with the NUL-terminated bytes of `path`, for a system call.
    /// - Throws: ``NULInPathError`` when the path contains a NUL byte, which no file name can hold
    ///   (passing it on would silently name a shorter path).
    public static func withCString<T>(_ path: String, _ body: (UnsafePointer<CChar>) throws -> T) throws -> T {
        // The common case — no escape-range scalar (UTF-8 F4 …) and no NUL — is the string's own
        // NUL-terminated UTF-8, passed without a copy.
        var path = path
        let plain = path.withUTF8 { utf8 in
            utf8.isEmpty
                || (memchr(utf8.baseAddress!, 0xF4, utf8.count) == nil
                    && memchr(utf8.baseAddress!, 0, utf8.count) == nil)
        }
        if plain { return try path.withCString(body) }
        var bytes = bytes(of: path)
        guard !bytes.contains(0) else { throw NULInPathError(path: display(path)) }
        bytes.append(0)
        return try bytes.withUnsafeBufferPointer { buffer in
            try buffer.withMemoryRebound(to: CChar.self) { try body($0.baseAddress!) }
        }
    }

    /// The components of `path` as the kernel splits it: at every `/` byte. `String.split` works
    /// on characters, and a `/` followed by a combining mark (`"../\u{301}x"`) is one character
    /// to it — so a name check built on it sees `..\u{301}x` where the kernel sees `..` then
    /// `\u{301}x`. Every check of a path's components goes through this.
    public static func components(of path: String, omittingEmpty: Bool = true) -> [String] {
        path.unicodeScalars.split(separator: "/", omittingEmptySubsequences: omittingEmpty).map {
            String(String.UnicodeScalarView($0))
        }
    }

    /// Whether `name` is, byte for byte, `.` or `..` (a dot with a combining mark is neither).
    public static func isDotOrDotDot(_ name: String) -> Bool {
        let scalars = Array(name.unicodeScalars)
        return scalars == ["."] || scalars == [".", "."]
    }

    /// Whether the first byte of `path` is `/` (`String.hasPrefix("/")` is false for `/\u{301}…`).
    public static func isAbsolute(_ path: String) -> Bool { path.unicodeScalars.first == "/" }

    /// `name`'s bytes, to compare or key names as the file system does: two names that Unicode
    /// calls equal (NFC `é` and NFD `e\u{301}`) are two files.
    public static func key(_ name: String) -> [UInt8] { bytes(of: name) }

    /// Whether `string` maps to bytes that are valid UTF-8 (no escaped byte).
    public static func isUTF8(_ string: String) -> Bool {
        !string.unicodeScalars.contains { escapeRange.contains($0.value) }
    }

    /// `string` for a message or a terminal: escaped bytes as `\xNN`, control characters as
    /// `\n`, `\t` or `\xNN`, so one name is one line and can be told apart from its neighbours.
    public static func display(_ string: String) -> String {
        var out = ""
        for scalar in string.unicodeScalars {
            if escapeRange.contains(scalar.value) {
                out += "\\x" + hex2(UInt8(scalar.value - escapeBase))
            } else if scalar == "\n" {
                out += "\\n"
            } else if scalar == "\t" {
                out += "\\t"
            } else if scalar.value < 0x20 || scalar.value == 0x7F {
                out += "\\x" + hex2(UInt8(scalar.value))
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// JSON text (as `JSONEncoder` writes it) with each byte that is not UTF-8 written as the
    /// escape `\udcHH` — Python's `surrogateescape`, as borg's JSON does: `os.fsencode` of the
    /// decoded string gives the name's bytes back. Every other character is left as it is.
    public static func surrogateEscaped(_ json: String) -> String {
        guard !isUTF8(json) else { return json }
        var out = ""
        for scalar in json.unicodeScalars {
            if escapeRange.contains(scalar.value) {
                out += "\\udc" + hex2(UInt8(scalar.value - escapeBase)).lowercased()
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    private static func hex2(_ byte: UInt8) -> String {
        let digits = Array("0123456789ABCDEF")
        return String([digits[Int(byte >> 4)], digits[Int(byte & 0xF)]])
    }

    /// The length of the valid UTF-8 sequence starting at `index`, or 0 when there is none.
    private static func validSequenceLength(_ bytes: [UInt8], at index: Int) -> Int {
        let lead = bytes[index]
        let length: Int
        switch lead {
        case 0x00...0x7F: return 1
        case 0xC2...0xDF: length = 2
        case 0xE0...0xEF: length = 3
        case 0xF0...0xF4: length = 4
        default: return 0
        }
        guard index + length <= bytes.count else { return 0 }
        return String(validating: bytes[index..<index + length], as: UTF8.self) == nil ? 0 : length
    }
}

/// A path given as a string holds a NUL byte, which no system call can take.
public struct NULInPathError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// The path, as ``LosslessPath/display(_:)`` shows it.
    public let path: String
    public var description: String { "\(path): a file name cannot contain a NUL byte" }
    public var errorDescription: String? { description }
}
