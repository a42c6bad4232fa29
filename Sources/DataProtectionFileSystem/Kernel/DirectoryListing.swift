import CFUSEKernel

/// The entries of one READDIR or READDIRPLUS answer, encoded as the kernel reads them
/// (`fuse_dirent`, and `fuse_direntplus` with an entry first), up to the size it asked for.
struct DirectoryListing {
    /// At most this many bytes (the kernel's size, at most 128 KiB).
    let capacity: Int
    /// READDIRPLUS: each entry comes with what LOOKUP gives.
    let plus: Bool
    private(set) var bytes: [UInt8] = []

    init(capacity: Int, plus: Bool) {
        self.capacity = min(capacity, 128 * 1024)
        self.plus = plus
        bytes.reserveCapacity(self.capacity)
    }

    /// A `fuse_dirent` without its name: inode, offset, name length, type.
    private static let direntSize = 24

    private func recordSize(nameLength: Int) -> Int {
        ((plus ? MemoryLayout<fuse_entry_out>.size : 0) + Self.direntSize + nameLength + 7) & ~7
    }

    /// Whether an entry with a name of `nameLength` bytes still fits (with READDIRPLUS, look
    /// the entry up only then: a lookup given counts one).
    func fits(nameLength: Int) -> Bool { bytes.count + recordSize(nameLength: nameLength) <= capacity }

    /// Adds an entry: its name, inode, the offset of the entry after it, and its type (`DT_*`);
    /// with READDIRPLUS, `entry` (`nil` for `.` and `..`, or a name that could not be looked
    /// up: the kernel looks it up itself). Call only when it ``fits(nameLength:)``.
    mutating func append(name: [UInt8], inode: UInt64, nextOffset: Int64, type: UInt8, entry: NodeEntry?) {
        let record = recordSize(nameLength: name.count)
        if plus {
            var out = entry.map(KernelReplier.encode) ?? fuse_entry_out()
            withUnsafeBytes(of: &out) { bytes += $0 }
        }
        var dirent = fuse_dirent()
        dirent.ino = inode
        dirent.off = UInt64(bitPattern: nextOffset)
        dirent.namelen = UInt32(name.count)
        dirent.type = UInt32(type)
        withUnsafeBytes(of: &dirent) { bytes += $0.prefix(Self.direntSize) }
        bytes += name
        bytes += [UInt8](
            repeating: 0, count: record - (plus ? MemoryLayout<fuse_entry_out>.size : 0) - Self.direntSize - name.count)
    }
}
