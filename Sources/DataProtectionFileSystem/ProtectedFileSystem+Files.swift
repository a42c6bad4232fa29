import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Regular files: one engine per file (every handle on it shares it), the class checked at
/// every open, read and write.
extension ProtectedFileSystem {
    // MARK: - Opening

    func openFile(_ nodeID: UInt64, _ options: OpenOptions) throws(Errno) -> UInt64 {
        let node = try nodes.node(nodeID)
        guard node.isRegularFile else { throw Errno(rawValue: node.isDirectory ? EISDIR : ENXIO) }
        let writable = options.isWritable
        if writable || options.truncates { try requireTerritory(node, else: EACCES) }
        try attach(node, writing: writable || options.truncates, reading: options.isReadable)
        do throws(Errno) {
            if options.truncates, writable {
                try truncateOpen(node, to: 0)
                if options.killsSetID { clearSetID(node) }
            }
        } catch {
            detach(node)
            throw error
        }
        lowerWALIndexClass(node, writable: writable)
        return handles.add(.file(node, writable: writable))
    }

    func createFile(
        _ name: [UInt8], in parentID: UInt64, mode: UInt32, _ options: OpenOptions
    ) throws(Errno) -> (NodeEntry, UInt64) {
        let parent = try nodes.node(parentID)
        try requireTerritory(parent, else: EACCES)
        try refuseReserved(name)
        try refuseSetID(mode, S_IFREG)
        let room = try nodes.reserve()
        defer { nodes.release(room) }
        let ((node, st), created) = try createProtectedFile(
            name, in: parent, mode: mode & 0o7777, exclusive: options.isExclusive,
            reservation: room)
        do throws(Errno) {
            if !created {
                try attach(node, writing: options.isWritable || options.truncates)
                if options.truncates {
                    do throws(Errno) { try truncateOpen(node, to: 0) } catch { detach(node); throw error }
                }
            }
        } catch {
            nodes.forget(node.id, count: 1)
            throw error
        }
        let handle = handles.add(.file(node, writable: options.isWritable))
        return (entry(node, created ? st : (try? node.status()) ?? st), handle)
    }

    /// Makes `name` in `parent` a new, empty protected file of the directory's default class,
    /// attached (one handle counted) — or, when it exists and `exclusive` is false, looks it up.
    func createProtectedFile(
        _ name: [UInt8], in parent: FileNode, mode: UInt32, exclusive: Bool,
        reservation: NodeTable.Reservation
    ) throws(Errno) -> (node: (FileNode, stat), created: Bool) {
        let fd = withName(name) { openat(parent.fd, $0, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode) }
        if fd < 0 {
            let code = errno
            guard code == EEXIST, !exclusive else { throw Errno(rawValue: code) }
            return (try nodes.lookup(name, in: parent, reservation: reservation), false)
        }
        if !Self.serverUmaskIsOff.load(ordering: .relaxed) { _ = fchmod(fd, mode) }
        let cls = newFileClass(named: name, in: parent)
        let engine: ProtectedFileEngine
        do {
            engine = try runBlocking { [files] in
                try await files.createEngine(
                    fd: FileDescriptor(rawValue: fd), path: self.describe(name), protection: cls)
            }
        } catch {
            close(fd)
            _ = withName(name) { unlinkat(parent.fd, $0, 0) }
            throw Self.errorCode(error)
        }
        let pathFD = withName(name) { openat(parent.fd, $0, O_PATH | O_NOFOLLOW | O_CLOEXEC) }
        var st = stat()
        guard pathFD >= 0, fstat(pathFD, &st) == 0 else {
            let code = errno
            if pathFD >= 0 { close(pathFD) }
            close(fd)
            throw Errno(rawValue: code)
        }
        let node: FileNode
        do { node = try nodes.adopt(pathFD, st, parent: parent, name: name, reservation: reservation) } catch {
            close(fd)
            throw error
        }
        kinds.record(.protected(engine.prefix), for: st)
        attach(node, newFile: fd, engine: engine, protectionClass: cls)
        return ((node, st), true)
    }

    /// Counts one more handle on the file, opening its backing descriptor and engine if none is
    /// open. Refuses a protected file whose class cannot be opened now (`EACCES`) and one whose
    /// header does not parse (`EIO`). A plain file is served read-only (`EACCES` for writing:
    /// nothing plain is written through the mount), except an empty one, which becomes a
    /// protected file of its directory's class when opened for writing.
    func attach(_ node: FileNode, writing: Bool, reading: Bool = true) throws(Errno) {
        if writing, node.isReadOnly { throw Errno(rawValue: EPERM) }
        for _ in 0..<8 {
            if try attachOnce(node, writing: writing, reading: reading) { return }
        }
        throw Errno(rawValue: EAGAIN)   // opened and closed by others at every try
    }

    /// One try of ``attach(_:writing:)``; `false` when the file's last other handle closed while
    /// this one was being counted (try again).
    private func attachOnce(_ node: FileNode, writing: Bool, reading: Bool) throws(Errno) -> Bool {
        // A file replaced or removed beside the mount (another process wrote the directory) while
        // the kernel still had its name: ESTALE makes the kernel look the name up again and open
        // what is there now.
        // A file this mount holds open is the one the caller means, linked or not (a reopen
        // through /proc/self/fd of an unlinked file).
        guard (try node.status()).st_nlink > 0 || node.open.withLock({ $0.handles > 0 }) else {
            throw Errno(rawValue: ESTALE)
        }
        // The class: the open file's, else from the header on a descriptor opened now.
        var fd: Int32 = -1, writable = false, cls: ProtectionClass?
        if let open = node.open.withLock({
            $0.handles > 0 && $0.descriptor >= 0 ? ($0.protectionClass, $0.writable) : nil
        }) {
            cls = open.0
            if cls == nil, writing { throw Errno(rawValue: EACCES) }   // a plain file, read-only
            // The caller's own rights, as the backing file has them now: another handle's
            // descriptor says nothing of them (its mode may have changed since, or its opener
            // asked for other rights).
            let rights = (writing ? W_OK : 0) | (reading ? R_OK : 0)
            if rights != 0, faccessat(AT_FDCWD, node.reopenPath, rights, AT_EACCESS) != 0 {
                throw Errno(rawValue: errno)
            }
        } else {
            fd = open(node.reopenPath, O_RDWR | O_CLOEXEC)
            writable = true
            if fd < 0, errno == EACCES || errno == EROFS || errno == ETXTBSY {
                // Opened for writing: the caller may not write it (every caller has this server's
                // user ID: the backing file's answer is the caller's).
                if writing { throw Errno(rawValue: errno) }
                fd = open(node.reopenPath, O_RDONLY | O_CLOEXEC)
                writable = false
            }
            guard fd >= 0 else { throw Errno(rawValue: errno) }
            var st = stat()
            guard fstat(fd, &st) == 0 else { let code = errno; close(fd); throw Errno(rawValue: code) }
            let kind = Self.kind(of: fd, st)
            kinds.record(kind, for: st)
            switch kind {
            case .damaged:
                close(fd)
                throw Errno(rawValue: EIO)
            case .protected(let prefix):
                cls = prefix.protectionClass
            case .plain:
                if writing {
                    guard st.st_size == 0, writable else { close(fd); throw Errno(rawValue: EACCES) }
                    try attachProtectingEmptyFile(node, fd: fd)
                    return true
                }
            }
        }
        // Without holding the node while asking the keybag.
        if let cls, !mayOpen(cls) {
            if fd >= 0 { close(fd) }
            throw Errno(rawValue: EACCES)
        }
        let counted = node.open.withLock { file -> Bool in
            if file.handles == 0 || file.descriptor < 0 {
                guard fd >= 0 else { return false }   // the other handles closed meanwhile
                if file.descriptor >= 0 { close(file.descriptor) }
                file.descriptor = fd
                file.writable = writable
                file.protectionClass = cls
                file.engine = nil
            } else if fd >= 0 {
                close(fd)   // opened by another handle meanwhile: that one's descriptor stays
            }
            file.handles += 1
            if file.protectionClass == .complete { file.mayHavePages = true }
            return true
        }
        guard counted else { return false }
        do throws(Errno) { _ = try engine(of: node, writing: false, opening: true) } catch {
            detach(node)
            throw error
        }
        return true
    }

    /// What the file open at `fd` (described by `st`) is, by its first bytes.
    static func kind(of fd: Int32, _ st: stat) -> ProtectedFilePrefix.Kind {
        guard st.st_size >= 2 else { return .plain }
        var bytes = [UInt8](repeating: 0, count: min(ProtectedFilePrefix.length, Int(st.st_size)))
        let n = pread(fd, &bytes, bytes.count, 0)
        return n > 0 ? ProtectedFilePrefix.kind(of: Array(bytes[0..<n])) : .plain
    }

    /// An empty plain file opened for writing (`fd`, read-write): it becomes a new protected
    /// file of its directory's class (header and empty final segment written), and is attached.
    private func attachProtectingEmptyFile(_ node: FileNode, fd: Int32) throws(Errno) {
        let parent = (try? nodes.node(node.parent.withLock { $0 })) ?? nodes.root
        let cls = defaultClass(in: parent)
        let engine: ProtectedFileEngine
        do {
            engine = try runBlocking { [files] in
                try await files.createEngine(
                    fd: FileDescriptor(rawValue: fd), path: self.describe(node), protection: cls)
            }
        } catch {
            close(fd)
            throw Self.errorCode(error)
        }
        attach(node, newFile: fd, engine: engine, protectionClass: cls)
        kinds.forget(node.identity)
    }

    /// Counts one more handle on a file just made protected (its read-write descriptor and its
    /// new engine); if another handle opened it meanwhile, that one's descriptor and engine stay.
    private func attach(
        _ node: FileNode, newFile fd: Int32, engine: ProtectedFileEngine, protectionClass cls: ProtectionClass
    ) {
        node.open.withLock { file in
            if file.handles == 0 {
                if file.descriptor >= 0 { close(file.descriptor) }
                file.descriptor = fd
                file.writable = true
                file.engine = engine
                file.protectionClass = cls
            } else {
                close(fd)
            }
            file.handles += 1
            if cls == .complete { file.mayHavePages = true }
        }
    }

    /// Counts one handle less; with none left, the engine (and the key it holds) and the
    /// backing descriptor go, and what the file now is goes into ``kinds``.
    func detach(_ node: FileNode) {
        let passedOver = node.open.withLock { file -> Bool in
            file.handles -= 1
            guard file.handles <= 0 else { return false }
            file.handles = 0
            defer { file.passedOverWhileOpen = false }
            // Written in place: the file's end is authenticated again (FORMAT.md §3). A failure
            // leaves it marked as being written, which still opens.
            if file.writable { try? file.engine?.settle() }
            var st = stat()
            if let engine = file.engine, fstat(file.descriptor, &st) == 0 {
                kinds.record(.protected(engine.prefix), for: st)
            }
            file.engine = nil
            if file.descriptor >= 0 { close(file.descriptor) }
            file.descriptor = -1
            return file.passedOverWhileOpen
        }
        if passedOver { nodes.fileClosed() }
    }

    func release(_ nodeID: UInt64, handle: UInt64) {
        if case .file(let node, _)? = handles.remove(handle) { detach(node) }
    }

    // MARK: - Reading and writing

    /// The open file's engine (a protected file) or `nil` (a plain file), after the class
    /// check for a read or a write; an engine dropped at a lock is opened again once its class
    /// is available.
    @discardableResult
    func engine(of node: FileNode, writing: Bool, opening: Bool = false) throws(Errno) -> ProtectedFileEngine? {
        let (cls, current, fd) = node.open.withLock { ($0.protectionClass, $0.engine, $0.descriptor) }
        // A plain file (served read-only: an empty one opened for writing was made protected at attach).
        guard let cls else { return nil }
        if writing ? !gate.mayWrite(cls) : !gate.mayRead(cls) { throw Errno(rawValue: EACCES) }
        if let current { return current }
        guard opening || mayOpen(cls) else { throw Errno(rawValue: EACCES) }
        let opened: ProtectedFileEngine
        do {
            opened = try runBlocking { [files] in
                try await files.openEngine(fd: FileDescriptor(rawValue: fd), path: self.describe(node))
            }
        } catch {
            throw Self.errorCode(error)
        }
        return node.open.withLock { file in
            if let engine = file.engine { return engine }
            file.engine = opened
            return opened
        }
    }

    func read(_ nodeID: UInt64, handle: UInt64, at offset: Int64, count: Int) throws(Errno) -> Data {
        let (node, _) = try handles.file(handle)
        if let engine = try engine(of: node, writing: false) {
            do { return try node.open.withLock { _ in try engine.read(at: offset, count: count) } } catch {
                throw Self.errorCode(error)
            }
        }
        let fd = node.open.withLock { $0.descriptor }
        var data = Data(count: count)
        let n = data.withUnsafeMutableBytes { pread(fd, $0.baseAddress, count, off_t(offset)) }
        guard n >= 0 else { throw Errno(rawValue: errno) }
        return data.prefix(n)
    }

    func write(
        _ nodeID: UInt64, handle: UInt64, _ bytes: UnsafeRawBufferPointer, at offset: Int64, killsSetID: Bool,
        _ request: RequestContext
    ) throws(Errno) -> Int {
        let (node, writable) = try handles.file(handle)
        guard writable else { throw Errno(rawValue: EBADF) }   // the kernel sends none: checked all the same
        // The request's buffer is this serving thread's, read into again by the next request:
        // class-A plaintext is cleared from it once answered, whatever the outcome (a write
        // refused at the lock included), by the file's class before or after the call.
        let classBefore = node.open.withLock { $0.protectionClass }
        defer {
            if classBefore == .complete || node.open.withLock({ $0.protectionClass }) == .complete,
                let base = bytes.baseAddress
            {
                memset(UnsafeMutableRawPointer(mutating: base), 0, bytes.count)
            }
        }
        if killsSetID { clearSetID(node) }
        if let engine = try engine(of: node, writing: true) {
            try withRoomForZeros(engine, upTo: offset) { () throws(Errno) in
                try extendWithZeros(node, engine, to: offset, request: request)
                do { try node.open.withLock { _ in try engine.write(bytes, at: offset) } } catch {
                    throw Self.errorCode(error)
                }
            }
        } else {
            throw Errno(rawValue: EACCES)   // a plain file is read-only through the mount
        }
        return bytes.count
    }

    func synchronize(_ nodeID: UInt64, handle: UInt64, dataOnly: Bool) throws(Errno) {
        let (node, handleWritable) = try handles.file(handle)
        let (fd, engine, writable) = node.open.withLock { ($0.descriptor, $0.engine, $0.writable) }
        guard (dataOnly ? fdatasync(fd) : fsync(fd)) == 0 else { throw Errno(rawValue: errno) }
        // The data is on the disk: the file's end is authenticated again (FORMAT.md §3), its
        // header written back with the next writeback or fsync.
        // Only through a handle that may write: a reader (another app's grant) never finishes
        // the owner's run of writes.
        if writable, handleWritable, let engine {
            do { try node.open.withLock { _ in try engine.settle() } } catch { throw Self.errorCode(error) }
        }
    }

    func allocate(
        _ nodeID: UInt64, handle: UInt64, at offset: Int64, length: Int64, mode: UInt32, _ request: RequestContext
    ) throws(Errno) {
        let (node, writable) = try handles.file(handle)
        guard writable else { throw Errno(rawValue: EBADF) }
        let keepSize = UInt32(FALLOC_FL_KEEP_SIZE)
        guard mode & ~keepSize == 0 else { throw Errno(rawValue: EOPNOTSUPP) }
        // As fallocate(2) answers: a negative offset or a length that is not positive, EINVAL; an
        // end past the largest size, EFBIG.
        guard offset >= 0, length > 0 else { throw Errno(rawValue: EINVAL) }
        let (end, overflow) = offset.addingReportingOverflow(length)
        guard !overflow else { throw Errno(rawValue: EFBIG) }
        if let engine = try engine(of: node, writing: true) {
            // Space is not reserved (a protected file's segments are written when sealed); the
            // size grows as asked unless KEEP_SIZE.
            if mode & keepSize == 0, end > engine.size { try truncateOpen(node, to: end, request: request) }
        } else {
            throw Errno(rawValue: EACCES)
        }
    }

    /// SETATTR's size: through the given handle's file, or the file opened for the call.
    func truncate(_ node: FileNode, to size: Int64, handle: UInt64?, request: RequestContext) throws(Errno) {
        guard size >= 0 else { throw Errno(rawValue: EINVAL) }
        if let handle {
            guard let (held, writable) = try? handles.file(handle), held === node, writable else {
                throw Errno(rawValue: EBADF)
            }
        }
        if handle == nil { try attach(node, writing: true) }
        defer { if handle == nil { detach(node) } }
        try truncateOpen(node, to: size, request: request)
    }

    /// Truncates a file that has a handle open.
    func truncateOpen(_ node: FileNode, to size: Int64, request: RequestContext = .uninterruptible) throws(Errno) {
        if let engine = try engine(of: node, writing: true) {
            try withRoomForZeros(engine, upTo: size) { () throws(Errno) in
                try extendWithZeros(node, engine, to: size, request: request)
                do { try node.open.withLock { _ in try engine.truncate(to: size) } } catch {
                    throw Self.errorCode(error)
                }
            }
        } else {
            throw Errno(rawValue: EACCES)
        }
    }

    /// The most zeros one request may make a protected file write (a write far past its end, a
    /// truncation or `fallocate` up): its zeros are sealed segments, not holes.
    static let maxZeroFill: Int64 = 4 << 30

    /// Runs `body`, which extends `engine`'s file to `size` with zeros, once the fill has room:
    /// refused beyond ``maxZeroFill`` (`EFBIG`), beyond the disk's free space less what fills
    /// under way will take (`ENOSPC`), or past the fills the requesting program may have at once
    /// (`EAGAIN`, ``ZeroFills``), before anything is written.
    func withRoomForZeros(
        _ engine: ProtectedFileEngine, upTo size: Int64, _ body: () throws(Errno) -> Void
    ) throws(Errno) {
        let gap = size - engine.size
        guard gap > 0 else { return try body() }
        guard gap <= Self.maxZeroFill else { throw Errno(rawValue: EFBIG) }
        var st = statvfs()
        guard fstatvfs(engine.fd.rawValue, &st) == 0 else { throw Errno(rawValue: errno) }
        let free = Int64(st.f_bavail) * Int64(st.f_frsize)
        let needed = gap + gap / 4096 * 28 + 64 << 20   // sealed zeros, and room left for others
        let fill = try fills.begin(
            bytes: needed, free: free, long: gap > Self.zeroFillStep, program: Requester.namespace)
        defer { fills.end(fill) }
        try body()
    }

    /// Zeros are sealed in steps of this many bytes, each under the file's lock, so that a long
    /// fill lets other requests on the file in between and stops when its request is interrupted.
    static let zeroFillStep: Int64 = 64 << 20

    /// Extends `engine`'s file with zeros up to `size` step by step (nothing when it is that long
    /// already); `EINTR` when the kernel interrupts `request` (its program got a signal): the
    /// file keeps the zeros sealed so far.
    func extendWithZeros(
        _ node: FileNode, _ engine: ProtectedFileEngine, to size: Int64, request: RequestContext
    ) throws(Errno) {
        while true {
            let current = node.open.withLock { _ in engine.size }
            guard size - current > Self.zeroFillStep else { return }   // the last step: the caller's own call
            if request.isInterrupted { throw Errno(rawValue: EINTR) }
            do { try node.open.withLock { _ in try engine.truncate(to: current + Self.zeroFillStep) } } catch {
                throw Self.errorCode(error)
            }
        }
    }

    /// Clears a file's set-user-ID and set-group-ID bits, as a write by its owner does on other
    /// file systems (the kernel leaves it to the server: `FUSE_HANDLE_KILLPRIV_V2`).
    func clearSetID(_ node: FileNode) {
        guard let st = try? node.status(), st.st_mode & (S_ISUID | S_ISGID) != 0 else { return }
        _ = chmod(node.reopenPath, st.st_mode & 0o7777 & ~(S_ISUID | S_ISGID))
    }

    // MARK: - Errors

    /// The errno a request gets for a library error: a class that is locked is `EACCES`; a
    /// damaged file `EIO`; a system call's own errno otherwise.
    static func errorCode(_ error: any Error) -> Errno {
        switch error {
        case let error as Errno: return error
        case let error as ProtectedFileError:
            switch error {
            case .unavailable, .keybag: return Errno(rawValue: EACCES)
            case .fileSystem(let system): return Errno(rawValue: system.errno.rawValue)
            case .noSuchFile: return Errno(rawValue: ENOENT)
            case .isDirectory: return Errno(rawValue: EISDIR)
            default: return Errno(rawValue: EIO)
            }
        case is KeybagError: return Errno(rawValue: EACCES)
        default: return Errno(rawValue: EIO)
        }
    }

    /// How a file is named in the library's errors and the log.
    func describe(_ name: [UInt8]) -> String { directory + "/…/" + String(decoding: name, as: UTF8.self) }
    func describe(_ node: FileNode) -> String { directory + " (inode \(node.inode))" }
}
