/// What SQLite leaves on disk, told apart by bytes alone (no key, no connection): a plaintext
/// database, and whether a WAL or rollback journal beside an encrypted one holds plaintext pages.
/// SQLCipher keeps the WAL and journal headers in the clear but seals every page image in them;
/// a plaintext page there is a copy of rows the database itself protects.
enum SQLitePages {
    static let databaseMagic = Array("SQLite format 3\u{0}".utf8)
    private static let walMagic: [[UInt8]] = [[0x37, 0x7F, 0x06, 0x82], [0x37, 0x7F, 0x06, 0x83]]
    private static let journalMagic: [UInt8] = [0xD9, 0xD5, 0x05, 0xF9, 0x20, 0xA1, 0x63, 0xD7]

    static func isPlaintextDatabase(_ prefix: [UInt8]) -> Bool { prefix.starts(with: databaseMagic) }

    /// Whether a file named like a side file starts as SQLite writes one: a WAL's or journal's
    /// magic (a journal reset to zeros after a commit too), or a wal-index (version 3007000).
    static func isSideFile(_ prefix: [UInt8], suffix: String) -> Bool {
        switch suffix {
        case "-wal": walMagic.contains { prefix.starts(with: $0) }
        case "-journal":
            prefix.starts(with: journalMagic) || (prefix.count >= 28 && prefix.prefix(28).allSatisfy { $0 == 0 })
        case "-shm":
            prefix.count >= 4
                && (prefix.prefix(4).elementsEqual([0x18, 0xE2, 0x2D, 0x00]) || prefix.prefix(4).allSatisfy { $0 == 0 })
        default: false
        }
    }

    /// Whether the side file (`-wal` or `-journal`, read through `read(count, offset)`) holds a
    /// plaintext page in its first frame or record. An empty or reset one holds none.
    static func sidecarHoldsPlaintext(size: Int64, read: (Int, Int64) -> [UInt8]) -> Bool {
        let header = read(32, 0)
        guard header.count >= 28 else { return false }
        if walMagic.contains(where: { header.starts(with: $0) }) {
            let pageSize = Int(u32(header, 8))
            guard isPageSize(pageSize), size >= 32 + 24 + Int64(pageSize) else { return false }
            let frame = read(24, 32)
            return looksLikePlaintextPage(read(pageSize, 32 + 24), pageNumber: frame.count == 24 ? u32(frame, 0) : 0)
        }
        if header.starts(with: journalMagic) {
            let sector = Int(u32(header, 20)), pageSize = Int(u32(header, 24))
            guard isPageSize(pageSize), sector >= 32, sector <= 65_536, size >= Int64(sector + 4 + pageSize) else {
                return false
            }
            let number = read(4, Int64(sector))
            return looksLikePlaintextPage(
                read(pageSize, Int64(sector + 4)), pageNumber: number.count == 4 ? u32(number, 0) : 0)
        }
        return false
    }

    /// A page as SQLite writes it in the clear: page 1 starts with the database header; any
    /// b-tree page starts with a header whose fields are consistent (a sealed page, random to
    /// anyone without the key, passes by chance about once in 65,000).
    static func looksLikePlaintextPage(_ page: [UInt8], pageNumber: UInt32) -> Bool {
        if page.starts(with: databaseMagic) { return true }
        let base = pageNumber == 1 ? 100 : 0
        guard page.count >= base + 12, isPageSize(page.count) else { return false }
        let type = page[base]
        guard [2, 5, 10, 13].contains(type) else { return false }
        let headerSize = type == 2 || type == 5 ? 12 : 8
        let firstFreeblock = Int(page[base + 1]) << 8 | Int(page[base + 2])
        let cells = Int(page[base + 3]) << 8 | Int(page[base + 4])
        let rawStart = Int(page[base + 5]) << 8 | Int(page[base + 6])
        let contentStart = rawStart == 0 ? 65_536 : rawStart
        let fragmented = Int(page[base + 7])
        let pointersEnd = base + headerSize + 2 * cells
        return fragmented <= 60 && pointersEnd <= contentStart && contentStart <= page.count
            && (firstFreeblock == 0 || (firstFreeblock >= contentStart && firstFreeblock < page.count))
    }

    private static func isPageSize(_ n: Int) -> Bool { n >= 512 && n <= 65_536 && n & (n - 1) == 0 }

    private static func u32(_ bytes: [UInt8], _ at: Int) -> UInt32 {
        UInt32(bytes[at]) << 24 | UInt32(bytes[at + 1]) << 16 | UInt32(bytes[at + 2]) << 8 | UInt32(bytes[at + 3])
    }
}
