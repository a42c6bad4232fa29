import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// Writing the restored tree: files first (protected files rewrapped, sealed plain files
/// decrypted), links last, nothing left behind on failure.
extension RestoreEngine {
    func restore(
        _ entries: [ManifestEntry], into destination: URL, files: ProtectedFileManager,
        outwardLinks: Set<[UInt8]>, unreadable: [[UInt8]: String], backupKeys: BackupClassKeys?,
        listedObjects: Set<String>, options: RestoreOptions, reportingAs finalDestination: URL,
        log: (String) -> Void, progress: (BackupProgress) -> Void
    ) async throws -> RestoreSummary {
        var summary = RestoreSummary()
        var done = BackupProgress(
            items: 0, totalItems: entries.count, bytes: 0,
            totalBytes: entries.reduce(0) { $0 + ($1.kind == .file ? $1.size : 0) })
        func target(_ entry: ManifestEntry) -> String { destination.path + "/" + entry.path }
        var leftOut: Set<[UInt8]> = []   // files not restored: no mode or time is set on their names
        let local = files.keybag.id
        // Directories and files first, links last: no link can redirect a later write.
        for entry in entries where entry.kind != .symlink {
            // Ctrl-C: the caller removes what was written, and says nothing was restored.
            if Task.isCancelled { throw CancellationError() }
            try Self.checkParents(of: entry.path, in: destination.path)
            switch entry.kind {
            case .directory:
                try POSIXFile.call("mkdir", target(entry)) { mkdir($0, 0o700) }
                // Before its mode is restored (a user xattr needs write permission).
                if let cls = entry.defaultClass.flatMap({ ProtectionClass(rawValue: UInt8($0)) }) {
                    try DirectoryDefault.set(cls, target(entry))
                }
                summary.directories += 1
            case .file:
                do {
                    if let why = unreadable[LosslessPath.key(entry.path)] { throw DamagedContent(issue: why) }
                    // The object is copied (its SHA-256 and size checked) before any byte of it is
                    // believed, the keybag its header names included.
                    let copy = entry.sealed ? destination.path + "/.dp-restore-\(UUID().uuidString)" : target(entry)
                    defer { if entry.sealed { _ = try? POSIXFile.call("unlink", copy) { unlink($0) } } }
                    try copyObject(
                        entry, to: copy, expectedSize: entry.sealed ? nil : entry.size, listedObjects: listedObjects)
                    // An encrypted database is restored as it is: its key file, a protected file,
                    // is what belongs to a device (and is rewrapped or left out as such).
                    if entry.encryptedDatabase {
                        summary.files += 1
                        done.bytes += entry.size
                        done.items += 1
                        progress(done)
                        continue
                    }
                    let owner = try Self.keybagID(of: URL(fileURLWithPath: copy))
                    if owner != local, entry.thisDeviceOnly {
                        _ = try? POSIXFile.call("unlink", copy) { unlink($0) }
                        log(
                            "Not restored (this device only): \(LosslessPath.display(finalDestination.path + "/" + entry.path))"
                        )
                        summary.skippedThisDeviceOnly += 1
                        leftOut.insert(LosslessPath.key(entry.path))
                        done.items += 1
                        progress(done)
                        continue
                    }
                    if owner != local {
                        // Made on this device, yet protected by another device's keybag (copied in, never adopted):
                        // no key here opens it.
                        guard let backupKeys else { throw DamagedContent.otherDevice }
                        try await files.adoptFile(at: URL(fileURLWithPath: copy), from: backupKeys)
                        if !entry.sealed { summary.adoptedFiles += 1 }
                    }
                    // A plain file: the sealed object's plaintext.
                    if entry.sealed {
                        try await writePlaintext(of: copy, to: target(entry), expectedSize: entry.size, files: files)
                    }
                } catch let error where Self.isContentDamage(error) {
                    let issue = (error as? DamagedContent)?.issue ?? DamagedContent.unauthentic.issue
                    if options.allOrNothing {
                        throw BackupError.badBackup(
                            path: backup.path,
                            reason: "\(LosslessPath.display(entry.path)): \(issue) (verify the backup)")
                    }
                    // Only this file: what was written of it goes, the rest of the backup is restored.
                    _ = try? POSIXFile.call("unlink", target(entry)) { unlink($0) }
                    log(
                        "Not restored (damaged: \(issue)): \(LosslessPath.display(finalDestination.path + "/" + entry.path))"
                    )
                    summary.damagedFiles.append(.init(path: entry.path, issue: issue))
                    leftOut.insert(LosslessPath.key(entry.path))
                    done.items += 1
                    progress(done)
                    continue
                }
                summary.files += 1
                done.bytes += entry.size
            case .symlink:
                break
            }
            done.items += 1
            progress(done)
        }
        for entry in entries where entry.kind == .symlink {
            if outwardLinks.contains(LosslessPath.key(entry.path)) {
                log(
                    "Not restored (a link leading outside the restored tree): \(LosslessPath.display(finalDestination.path + "/" + entry.path)) -> \(LosslessPath.display(entry.linkTarget ?? ""))"
                )
                summary.skippedOutwardLinks += 1
                done.items += 1
                progress(done)
                continue
            }
            try Self.checkParents(of: entry.path, in: destination.path)
            try POSIXFile.call("symlink", entry.linkTarget!, target(entry)) { symlink($0, $1) }
            summary.symlinks += 1
            done.items += 1
            progress(done)
        }
        // Modes and times, deepest first so a directory's time is not disturbed afterwards.
        let mask: mode_t = options.keepModes ? 0 : POSIXFile.currentUmask()
        for entry in entries.reversed() where entry.kind != .symlink && !leftOut.contains(LosslessPath.key(entry.path))
        {
            let path = target(entry)
            let mode = mode_t(entry.mode) & 0o777 & ~mask   // never set-id or sticky bits
            try POSIXFile.call("chmod", path) { chmod($0, mode) }
            let seconds = entry.mtime.rounded(.down)
            let stamp = timespec(tv_sec: Int(seconds), tv_nsec: min(999_999_999, Int((entry.mtime - seconds) * 1e9)))
            var times = [stamp, stamp]
            try POSIXFile.call("utimensat", path) { utimensat(AT_FDCWD, $0, &times, AT_SYMLINK_NOFOLLOW) }
        }
        return summary
    }

    /// Decrypts a sealed object into a new plain file, in bounded memory; its size must be the
    /// one the manifest recorded.
    func writePlaintext(
        of sealed: String, to target: String, expectedSize: Int64, files: ProtectedFileManager
    ) async throws {
        let handle = try await files.openHandle(forReadingFrom: URL(fileURLWithPath: sealed))
        let output = try POSIXFile.open(
            target, .writeOnly, options: [.create, .exclusiveCreate, .noFollow], permissions: .ownerReadWrite)
        defer { try? output.close() }
        do {
            var offset: Int64 = 0
            let size = try await handle.size()
            guard size == expectedSize else { throw DamagedContent.wrongSize }
            while offset < size {
                let chunk = try await handle.read(at: offset, count: 1 << 20)
                try POSIXFile.write(output, chunk, at: offset, path: target)
                offset += Int64(chunk.count)
            }
            try POSIXFile.sync(output, path: target)
            try await handle.close()
        } catch {
            try? await handle.close()
            throw error
        }
    }

    /// Copies a file's object to `target`, checking its SHA-256 and size on the way.
    /// - Throws: ``DamagedContent`` when the object is missing, not a regular file, altered or
    ///   of the wrong size; the file system's errors as they are (they stop a restore).
    func copyObject(_ entry: ManifestEntry, to target: String, expectedSize: Int64?, listedObjects: Set<String>) throws
    {
        guard let sha = entry.sha256 else { throw DamagedContent.missing }
        if entry.chunked {
            // The list is read whole and checked before any chunk; each chunk is checked as it is copied.
            let list = try repository.chunkList(sha, size: entry.size)
            let output = try POSIXFile.open(
                target, .writeOnly, options: [.create, .exclusiveCreate, .noFollow], permissions: .ownerReadWrite)
            defer { try? output.close() }
            try repository.writeChunks(
                of: list, listedObjects: listedObjects, to: output, path: LosslessPath.display(target))
            return
        }
        let source = repository.objectURL(sha)
        let input: FileDescriptor
        do { input = try POSIXFile.openRegularFile(source.path) } catch let error as FileSystemError {
            switch error.errno {
            case .noSuchFileOrDirectory: throw DamagedContent.missing
            case .tooManySymbolicLinkLevels, .invalidArgument, .isDirectory, .notDirectory:
                throw DamagedContent.notRegular
            default: throw error
            }
        }
        defer { try? input.close() }
        let output = try POSIXFile.open(
            target, .writeOnly, options: [.create, .exclusiveCreate, .noFollow], permissions: .ownerReadWrite)
        defer { try? output.close() }
        // Never more than the manifest allows: a protected file is stored as it was; a sealed one
        // adds a header and at most 28 bytes per 4 KiB (the smallest segment).
        let limit = expectedSize ?? (160 + entry.size + 28 * (entry.size / 4096 + 1))
        let copied: (sha256: String, size: Int64)
        do {
            copied = try BackupRepository.copyHashing(
                from: input, source.path, to: output, LosslessPath.display(target), limit: limit)
        } catch BackupError.badBackup {
            throw DamagedContent.wrongSize   // longer than the manifest allows
        }
        guard copied.sha256 == sha else { throw DamagedContent.altered }
        if let expectedSize, copied.size != expectedSize { throw DamagedContent.wrongSize }
    }

    /// Whether `error` is damage of one file's stored content (missing, altered, the wrong size,
    /// failing authentication), which a restore can leave out and go on past — not a failure of
    /// the destination, of the repository's file system or of the keys, which stops it.
    static func isContentDamage(_ error: any Error) -> Bool {
        switch error {
        case is DamagedContent, ProtectedFileError.damaged, ProtectedFileError.unsupportedVersion,
            ProtectedFileError.foreignKeybag, KeybagError.keyUnwrapFailed, KeybagError.foreignKeybag:
            true
        default: false
        }
    }
}
