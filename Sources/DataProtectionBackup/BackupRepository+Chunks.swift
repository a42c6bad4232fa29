import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

extension BackupRepository {
    /// What storing a file in chunks wrote.
    struct ChunkedFile {
        /// The chunk list's object name (the manifest entry's `sha256`).
        var list: String
        /// The packs the list names (for the backup's object list).
        var packs: [String]
        /// The file's bytes, as stored.
        var size: Int64
        /// What this store added to the repository: the new pack and the list.
        var bytesAdded: Int64
    }

    /// A new chunk of an encrypted database did not authenticate as ciphertext: the file must be
    /// sealed instead of stored as it is.
    struct NotCiphertext: Error {}

    /// Stores the regular file at `source` cut at `boundaries` (FORMAT.md §5.2). A chunk that
    /// `previous` (this file's list in an earlier backup, its packs present) holds is referred to
    /// where it is; the others go, in order, into one new pack. `check`, when given, is asked
    /// about each new chunk (with its index) and refusing one stops the store, which keeps nothing
    /// (``NotCiphertext``).
    func storeChunked(
        _ source: String, boundaries: ChunkBoundaries, previous: BackupChunkList?, requireProtected: Bool = false,
        check: ((UnsafeRawBufferPointer, Int) -> Bool)? = nil
    ) throws -> ChunkedFile {
        let input = try POSIXFile.openRegularFile(source)
        defer { try? input.close() }
        if requireProtected { try Self.requireProtectedFile(input, source) }
        // What the earlier version holds, by content (packs only if still present).
        var known: [[UInt8]: (pack: String, offset: Int64)] = [:]
        if let previous {
            let present = previous.packs.map(hasObject)
            for chunk in previous.chunks where present[chunk.pack] {
                known[chunk.sha256] = (previous.packs[chunk.pack], chunk.offset)
            }
        }
        let packTemp = objects.appendingPathComponent(".tmp-\(UUID().uuidString)")
        var pack: FileDescriptor?
        defer {
            try? pack?.close()
            unlink(packTemp.path)
        }
        var packHasher = SHA256()
        var packSize: Int64 = 0
        var packs: [String] = []
        var packIndex: [String: Int] = [:]
        let newPack = -1   // chunks of the pack being written, numbered once it is named
        var chunks: [BackupChunkList.Chunk] = []
        var offset: Int64 = 0
        // About 1 MiB per read, ending on a chunk boundary.
        let strideRun = max(1, (1 << 20) / boundaries.stride) * boundaries.stride
        var buffer = [UInt8](repeating: 0, count: max(boundaries.first, strideRun))
        let display = LosslessPath.display(source)
        while true {
            if Task.isCancelled { throw CancellationError() }
            let want = offset < Int64(boundaries.first) ? boundaries.first - Int(offset) : strideRun
            let got = try buffer.withUnsafeMutableBytes { raw in
                try POSIXFile.read(
                    input, into: UnsafeMutableRawBufferPointer(rebasing: raw[0..<want]), at: offset, path: display)
            }
            if got == 0 { break }
            try buffer.withUnsafeBytes { raw in
                var start = 0
                while start < got {
                    let length = min(boundaries.length(at: offset + Int64(start), size: .max), got - start)
                    let bytes = UnsafeRawBufferPointer(rebasing: raw[start..<start + length])
                    let sha = Array(SHA256.hash(data: bytes))
                    // Every chunk, found elsewhere or new, must pass the check.
                    if let check, !check(bytes, chunks.count) { throw NotCiphertext() }
                    if let (name, at) = known[sha] {
                        let index =
                            packIndex[name]
                            ?? {
                                packs.append(name); packIndex[name] = packs.count - 1; return packs.count - 1
                            }()
                        chunks.append(.init(pack: index, offset: at, length: length, sha256: sha))
                    } else {
                        if pack == nil {
                            pack = try POSIXFile.open(
                                packTemp.path, .writeOnly, options: [.create, .exclusiveCreate],
                                permissions: .ownerReadWrite)
                        }
                        try POSIXFile.write(pack!, bytes, at: packSize, path: packTemp.path)
                        packHasher.update(bufferPointer: bytes)
                        chunks.append(.init(pack: newPack, offset: packSize, length: length, sha256: sha))
                        packSize += Int64(length)
                    }
                    start += length
                }
            }
            offset += Int64(got)
            if got < want { break }
        }
        var added: Int64 = 0
        if let written = pack {
            try POSIXFile.sync(written, path: packTemp.path)
            let name = Array(packHasher.finalize()).hex
            try place(packTemp, as: name)
            // The same bytes as a pack already referred to (its chunks, in order): one entry for it.
            let index =
                packIndex[name]
                ?? {
                    packs.append(name); return packs.count - 1
                }()
            for i in chunks.indices where chunks[i].pack == newPack { chunks[i].pack = index }
            added += packSize
        }
        let list = BackupChunkList(packs: packs, chunks: chunks).encoded()
        let listName = try storeBytes(list)
        added += Int64(list.count)
        return ChunkedFile(list: listName, packs: packs, size: offset, bytesAdded: added)
    }

    /// Stores `bytes` as an object (written aside, flushed, renamed): its name.
    func storeBytes(_ bytes: [UInt8]) throws -> String {
        let name = Array(SHA256.hash(data: bytes)).hex
        if POSIXFile.linkStatus(objectURL(name).path) != nil { return name }
        let temp = objects.appendingPathComponent(".tmp-\(UUID().uuidString)")
        defer { unlink(temp.path) }
        try POSIXFile.writeAtomically(temp.path, bytes, permissions: .ownerReadWrite)
        try place(temp, as: name)
        return name
    }

    /// Moves a flushed temporary file into place as object `name` (dropped when that exists).
    private func place(_ temp: URL, as name: String) throws {
        let final = objectURL(name)
        // Here, not elsewhere: a remote repository's staging area keeps the lists it wrote.
        if POSIXFile.linkStatus(final.path) != nil { return }
        try Self.makeOwnerOnlyDirectory(final.deletingLastPathComponent())
        try POSIXFile.check("rename", final.path) { rename(temp.path, final.path) }
    }

    /// The chunk list stored as object `name` for a file of `size` bytes, its SHA-256 checked.
    /// - Throws: ``RestoreEngine/DamagedContent`` when it is missing, not a regular file, altered
    ///   or does not parse; the file system's other errors as they are.
    func chunkList(_ name: String, size: Int64) throws -> BackupChunkList {
        let bytes = try readObject(name, limit: BackupChunkList.maximumEncodedSize(forFileOfSize: size))
        do { return try BackupChunkList.parse(bytes, size: size) } catch let error as ChunkListError {
            throw RestoreEngine.DamagedContent(issue: "its chunk list is damaged (\(error.reason))")
        }
    }

    /// An object's bytes (at most `limit`), its SHA-256 checked against its name.
    func readObject(_ name: String, limit: Int64) throws -> [UInt8] {
        let input: FileDescriptor
        do { input = try POSIXFile.openRegularFile(objectURL(name).path) } catch let error as FileSystemError {
            switch error.errno {
            case .noSuchFileOrDirectory: throw RestoreEngine.DamagedContent.missing
            case .tooManySymbolicLinkLevels, .invalidArgument, .isDirectory, .notDirectory:
                throw RestoreEngine.DamagedContent.notRegular
            default: throw error
            }
        }
        defer { try? input.close() }
        var st = stat()
        guard fstat(input.rawValue, &st) == 0, Int64(st.st_size) <= limit else {
            throw RestoreEngine.DamagedContent.wrongSize
        }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = try buffer.withUnsafeMutableBytes { raw in
                try POSIXFile.read(input, into: raw, at: Int64(bytes.count), path: objectURL(name).path)
            }
            bytes += buffer[0..<n]
            guard Int64(bytes.count) <= limit else { throw RestoreEngine.DamagedContent.wrongSize }
            if n < buffer.count { break }
        }
        guard Array(SHA256.hash(data: bytes)).hex == name else { throw RestoreEngine.DamagedContent.altered }
        return bytes
    }

    /// Writes a chunked file's bytes to `output`, flushed, checking each chunk's SHA-256 and that
    /// every pack is one the backup lists (`objects`).
    /// - Throws: ``RestoreEngine/DamagedContent`` for a missing, foreign, short or altered pack or chunk.
    func writeChunks(
        of list: BackupChunkList, listedObjects objects: Set<String>, to output: FileDescriptor, path: String
    ) throws {
        var packs: [Int: FileDescriptor] = [:]
        defer { for fd in packs.values { try? fd.close() } }
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var offset: Int64 = 0
        for chunk in list.chunks {
            if Task.isCancelled { throw CancellationError() }
            let name = list.packs[chunk.pack]
            guard objects.contains(name) else {
                throw RestoreEngine.DamagedContent(issue: "its chunk list names a pack the backup does not list")
            }
            let pack: FileDescriptor
            if let open = packs[chunk.pack] {
                pack = open
            } else {
                // A few packs open at a time: a file many backups changed can name thousands.
                if packs.count >= 16 {
                    for fd in packs.values { try? fd.close() }
                    packs.removeAll()
                }
                do { pack = try POSIXFile.openRegularFile(objectURL(name).path) } catch let error as FileSystemError {
                    switch error.errno {
                    case .noSuchFileOrDirectory: throw RestoreEngine.DamagedContent.missing
                    case .tooManySymbolicLinkLevels, .invalidArgument, .isDirectory, .notDirectory:
                        throw RestoreEngine.DamagedContent.notRegular
                    default: throw error
                    }
                }
                packs[chunk.pack] = pack
            }
            if buffer.count < chunk.length { buffer = [UInt8](repeating: 0, count: chunk.length) }
            try buffer.withUnsafeMutableBytes { raw in
                let slice = UnsafeMutableRawBufferPointer(rebasing: raw[0..<chunk.length])
                let got = try POSIXFile.read(pack, into: slice, at: chunk.offset, path: objectURL(name).path)
                guard got == chunk.length else { throw RestoreEngine.DamagedContent.wrongSize }
                guard Array(SHA256.hash(data: UnsafeRawBufferPointer(slice))) == chunk.sha256 else {
                    throw RestoreEngine.DamagedContent.altered
                }
                try POSIXFile.write(output, UnsafeRawBufferPointer(slice), at: offset, path: path)
            }
            offset += Int64(chunk.length)
        }
        try POSIXFile.sync(output, path: path)
    }
}
