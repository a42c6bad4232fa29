import Crypto
import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// The 160-byte header at the start of every protected file (`docs/FORMAT.md` § Protected file).
///
/// Everything in it is readable without a key — in particular the class, as iOS shows
/// `NSFileProtectionKey` while locked — and is authenticated by an HMAC under a key derived
/// from the file key once the file key is unwrapped.
package struct ProtectedFileHeader: Sendable, Equatable {
    static let magic: [UInt8] = [0x89, 0x44, 0x50, 0x46, 0x0D, 0x0A, 0x1A, 0x0A]   // \x89 D P F \r \n \x1a \n
    static let version: UInt16 = 1
    /// Page-aligned segments, written in place (files made for random access).
    static let pageAlignedVersion: UInt16 = 2
    package static let size = 160
    static let authenticatedSize = 128
    static let defaultSegmentSizeLog2: UInt8 = 16   // 64 KiB of plaintext per segment: files read whole
    static let randomAccessSegmentSizeLog2: UInt8 = 12   // 4 KiB: files read and written at offsets
    static let segmentSizeLog2Range: ClosedRange<UInt8> = 12...24

    /// 1: segments back to back after the header; 2: page-aligned segments, for files written in
    /// place (FORMAT.md §3, ``SegmentLayout``).
    var version: UInt16 = Self.version
    var segmentSizeLog2: UInt8
    /// Format 2: the file is being written in place — a write cut short may have left it ending
    /// in a segment not sealed final. Cleared when the writer is done.
    var beingWritten = false
    /// Format 2: a truncation to this length is under way (its new final segment may be written
    /// while the bytes after it are not yet cut off).
    var truncatingTo: Int64?
    /// 16 random bytes naming this file; part of every segment's associated data.
    var fileID: [UInt8]
    /// The file key, wrapped under the file's class by its keybag.
    var wrappedKey: WrappedFileKey

    var protectionClass: ProtectionClass { wrappedKey.protectionClass }
    var layout: SegmentLayout { SegmentLayout(version: version, log2: segmentSizeLog2) }

    init(
        version: UInt16 = Self.version, segmentSizeLog2: UInt8, fileID: [UInt8], wrappedKey: WrappedFileKey,
        beingWritten: Bool = false, truncatingTo: Int64? = nil
    ) {
        self.version = version
        self.segmentSizeLog2 = segmentSizeLog2
        self.fileID = fileID
        self.wrappedKey = wrappedKey
        self.beingWritten = beingWritten
        self.truncatingTo = truncatingTo
    }

    /// The header bytes, MAC included.
    func encoded(keys: FileKeys) -> [UInt8] {
        var w = ByteWriter()
        w.raw(Self.magic)
        w.u16(version)
        w.u16(UInt16(Self.size))
        w.u8(protectionClass.rawValue)
        w.u8(segmentSizeLog2)
        w.u8((wrappedKey.thisDeviceOnly ? 1 : 0) | (beingWritten ? 2 : 0) | (truncatingTo != nil ? 4 : 0))
        w.zeros(1)
        w.raw(fileID)
        w.raw(wrappedKey.keybagID.bytes)
        w.raw(wrappedKey.wrappedKey)
        w.raw(wrappedKey.ephemeralPublicKey ?? [UInt8](repeating: 0, count: 32))
        w.u64(UInt64(truncatingTo ?? 0))
        w.raw(Array(HMAC<SHA256>.authenticationCode(for: w.bytes, using: keys.headerKey)))
        return w.bytes
    }

    /// Checks the header MAC once the file key is known.
    static func verify(_ bytes: [UInt8], keys: FileKeys) -> Bool {
        bytes.count == size
            && HMAC<SHA256>.isValidAuthenticationCode(
                Array(bytes[authenticatedSize..<size]),
                authenticating: bytes[0..<authenticatedSize], using: keys.headerKey)
    }

    /// Whether `prefix` (the first bytes of a file) marks the protected format.
    ///
    /// A damaged protected file must never pass for a plain one, so this errs toward
    /// "protected" (FORMAT.md §3, "Recognising the format"). A file counts as protected — and
    /// then fails to parse as damaged — when:
    /// - its first 8 bytes match the magic in at least 6 places (one or two bytes damaged);
    /// - it starts with the signature `\x89DPF` (or `\x09DPF`, the high bit stripped by a
    ///   7-bit transfer), whatever follows: a text-mode transfer that turned `\r\n` into `\n`
    ///   shifts the rest of the magic, which is what the PNG-style magic is there to reveal;
    /// - it is shorter than 8 bytes and a prefix of the magic of at least 2 bytes (a truncated
    ///   protected file).
    /// A 1-byte file cannot be told apart and is plain.
    package static func looksProtected(_ prefix: [UInt8]) -> Bool {
        if prefix.count >= 4, prefix[1] == magic[1], prefix[2] == magic[2], prefix[3] == magic[3],
            prefix[0] == magic[0] || prefix[0] == magic[0] & 0x7F
        {
            return true
        }
        if prefix.count >= magic.count {
            return zip(prefix, magic).filter { $0 == $1 }.count >= 6
        }
        return prefix.count >= 2 && Array(magic[0..<prefix.count]) == prefix
    }

    /// Parses a header without any key. Every defect is an error; nothing traps.
    package static func parse(_ bytes: [UInt8], path: String) throws -> ProtectedFileHeader {
        func damaged(_ why: String) -> ProtectedFileError { .damaged(path: path, reason: why) }
        guard bytes.count >= 12 else { throw damaged("header truncated (\(bytes.count) bytes)") }
        guard Array(bytes[0..<8]) == magic else { throw damaged("bad magic") }
        var r = ByteReader(bytes)
        do {
            _ = try r.raw(8, "magic")
            let version = try r.u16("version")
            guard version == Self.version || version == Self.pageAlignedVersion else {
                throw ProtectedFileError.unsupportedVersion(path: path, version: version)
            }
            guard try r.u16("header length") == UInt16(size) else { throw damaged("unexpected header length") }
            guard bytes.count >= size else { throw damaged("header truncated (\(bytes.count) of \(size) bytes)") }
            guard let cls = ProtectionClass(rawValue: try r.u8("class")) else {
                throw damaged("unknown protection class")
            }
            let log2 = try r.u8("segment size")
            guard segmentSizeLog2Range.contains(log2) else { throw damaged("implausible segment size 2^\(log2)") }
            // Format 2's segments are pages: 4 KiB, the page every writer of this format has.
            guard version == Self.version || log2 == randomAccessSegmentSizeLog2 else {
                throw damaged("implausible page size 2^\(log2)")
            }
            let flags = try r.u8("flags")
            guard flags & ~(version == Self.version ? 1 : 7) == 0 else { throw damaged("unknown flags \(flags)") }
            guard try r.u8("reserved") == 0 else { throw damaged("reserved byte not zero") }
            let fileID = try r.raw(16, "file id")
            let keybagID = UUID(bytes: try r.raw(16, "keybag id"))
            let wrapped = try r.raw(40, "wrapped key")
            let ephemeral = try r.raw(32, "ephemeral key")
            let truncating = try r.u64("truncation length")
            guard flags & 4 != 0 || truncating == 0 else { throw damaged("reserved bytes not zero") }
            guard truncating < UInt64(Int64.max) else { throw damaged("implausible truncation length") }
            let hasEphemeral = ephemeral.contains { $0 != 0 }
            guard hasEphemeral == (cls == .completeUnlessOpen) else {
                throw damaged("ephemeral key does not match the class")
            }
            return ProtectedFileHeader(
                version: version, segmentSizeLog2: log2, fileID: fileID,
                wrappedKey: WrappedFileKey(
                    protectionClass: cls, keybagID: keybagID, wrappedKey: wrapped,
                    ephemeralPublicKey: hasEphemeral ? ephemeral : nil,
                    thisDeviceOnly: flags & 1 != 0),
                beingWritten: flags & 2 != 0, truncatingTo: flags & 4 != 0 ? Int64(truncating) : nil)
        } catch let error as ByteReader.OutOfBounds {
            throw damaged("header truncated at \(error.field)")
        }
    }
}

/// The two keys derived from a file key: HKDF-SHA256(ikm: file key, salt: file ID, info: label).
struct FileKeys: Sendable {
    let contentKey: SymmetricKey
    let headerKey: SymmetricKey

    /// HKDF-SHA256 of the file key, salted with the file ID, for each info string (FORMAT.md §3):
    /// the extraction, the same for both, done once.
    init(fileKey: SymmetricKey, fileID: [UInt8]) {
        let pseudoRandomKey = HKDF<SHA256>.extract(inputKeyMaterial: fileKey, salt: fileID)
        contentKey = HKDF<SHA256>.expand(
            pseudoRandomKey: pseudoRandomKey, info: Array("DataProtection v1 content".utf8), outputByteCount: 32)
        headerKey = HKDF<SHA256>.expand(
            pseudoRandomKey: pseudoRandomKey, info: Array("DataProtection v1 header".utf8), outputByteCount: 32)
    }
}
