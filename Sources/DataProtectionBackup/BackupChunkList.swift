import Crypto
import DataProtection
import DataProtectionSystem
import Foundation

/// How a big file's stored bytes are put together from chunks kept in pack objects
/// (FORMAT.md §5.2): the object a chunked manifest entry names.
///
/// A protected file or an encrypted database is cut where its format puts a segment or a page,
/// so a backup after a few segments or pages were rewritten stores only those (in a new pack)
/// and a new list; every other chunk is found where an earlier backup stored it.
struct BackupChunkList: Equatable {
    /// One chunk: `length` bytes at `offset` in pack number `pack`, whose SHA-256 is `sha256`.
    struct Chunk: Equatable {
        var pack: Int
        var offset: Int64
        var length: Int
        var sha256: [UInt8]
    }

    /// The packs' SHA-256s (their object names), in the order chunks refer to them.
    var packs: [String]
    var chunks: [Chunk]

    /// The bytes the chunks make, together.
    var size: Int64 { chunks.reduce(0) { $0 + Int64($1.length) } }

    static let magic: [UInt8] = [0x89, 0x44, 0x50, 0x42, 0x43, 0x0D, 0x0A, 0x1A]   // "\x89DPBC\r\n\x1a"
    static let version: UInt16 = 1
    static let headerSize = 20
    static let packRecordSize = 32
    static let chunkRecordSize = 48
    /// The longest chunk accepted (16 MiB): format 1's segments and the largest database pages are far shorter.
    static let maximumChunkLength = 1 << 24

    /// The list's bytes: big-endian, FORMAT.md §5.2.
    func encoded() -> [UInt8] {
        var out = ByteWriter(
            capacity: Self.headerSize + packs.count * Self.packRecordSize + chunks.count * Self.chunkRecordSize)
        out.raw(Self.magic)
        out.u16(Self.version)
        out.u16(0)
        out.u32(UInt32(packs.count))
        out.u32(UInt32(chunks.count))
        for pack in packs { out.raw([UInt8](hex: pack) ?? []) }
        for chunk in chunks {
            out.u32(UInt32(chunk.pack))
            out.u32(UInt32(chunk.length))
            out.u64(UInt64(chunk.offset))
            out.raw(chunk.sha256)
        }
        return out.bytes
    }

    /// Parses a list, checking every field; `size` is the size the manifest records for the file.
    /// - Throws: ``ChunkListError`` naming the first defect.
    static func parse(_ bytes: [UInt8], size: Int64) throws -> BackupChunkList {
        func bad(_ why: String) -> ChunkListError { ChunkListError(reason: why) }
        var reader = ByteReader(bytes)
        do {
            guard try reader.raw(8, "magic") == magic else { throw bad("not a chunk list") }
            let version = try reader.u16("version")
            guard version == Self.version else {
                throw bad("chunk list version \(version) is not supported by this build (it reads version 1)")
            }
            guard try reader.u16("reserved") == 0 else { throw bad("reserved bytes are not zero") }
            let packCount = Int(try reader.u32("pack count")), chunkCount = Int(try reader.u32("chunk count"))
            guard bytes.count == headerSize + packCount * packRecordSize + chunkCount * chunkRecordSize else {
                throw bad("its length does not match its counts")
            }
            guard packCount <= chunkCount, (chunkCount == 0) == (size == 0) else {
                throw bad("its counts do not match the file")
            }
            var packs: [String] = []
            for _ in 0..<packCount { packs.append(try reader.raw(32, "pack").hex) }
            guard Set(packs).count == packs.count else { throw bad("a pack is listed twice") }
            var chunks: [Chunk] = []
            chunks.reserveCapacity(chunkCount)
            var total: Int64 = 0
            var used = Set<Int>()
            for _ in 0..<chunkCount {
                let pack = Int(try reader.u32("pack index")), length = Int(try reader.u32("length"))
                let offset = try reader.u64("offset")
                guard pack < packCount else { throw bad("a chunk names pack \(pack) of \(packCount)") }
                guard (1...maximumChunkLength).contains(length) else { throw bad("a chunk of \(length) bytes") }
                guard offset <= UInt64(ManifestEntry.sizeLimit) else { throw bad("a chunk offset out of range") }
                total += Int64(length)
                guard total <= size else { throw bad("its chunks are longer than the file") }
                chunks.append(
                    Chunk(
                        pack: pack, offset: Int64(offset), length: length, sha256: try reader.raw(32, "chunk SHA-256")))
                used.insert(pack)
            }
            guard total == size else { throw bad("its chunks are shorter than the file") }
            guard used.count == packCount else { throw bad("a pack no chunk uses") }
            return BackupChunkList(packs: packs, chunks: chunks)
        } catch is ByteReader.OutOfBounds {
            throw bad("it is cut short")
        }
    }

    /// The most bytes a list for a file of `size` bytes may take (chunks of 512 bytes at least,
    /// but the last): what a restore reads of one before giving up.
    static func maximumEncodedSize(forFileOfSize size: Int64) -> Int64 {
        let chunks = size / 512 + 1
        return Int64(headerSize) + chunks * Int64(packRecordSize + chunkRecordSize)
    }
}

/// A chunk list that does not parse (FORMAT.md §5.2).
struct ChunkListError: Error, CustomStringConvertible {
    var reason: String
    var description: String { reason }
}

/// Where a file's stored bytes are cut into chunks.
struct ChunkBoundaries: Equatable {
    /// The end of the first chunk (a protected file's header and segment 0).
    var first: Int
    /// The length of every later chunk (the last may be shorter).
    var stride: Int

    /// The length of the chunk starting at `offset`, in a file of `size` bytes.
    func length(at offset: Int64, size: Int64) -> Int {
        let end = offset < Int64(first) ? Int64(first) : offset + Int64(stride)
        return Int(min(end, size) - offset)
    }
}
