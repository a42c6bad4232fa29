@testable import DataProtectionFileSystem
import CFUSEKernel
import DataProtection
@_spi(Testing) import DataProtectionKeybag
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import SystemPackage
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Request bytes as the kernel would send them, fed to the decoder and to the protected file
/// system's operations through a ``KernelSession`` — no `/dev/fuse`, no mount: replies go to a
/// socket pair and are read back as the kernel would read them.
struct KernelSessionTests {
    // MARK: - Building requests

    static let maxWrite = 1 << 20

    /// A message: `fuse_in_header` (its length the whole message's), then `body`.
    static func message(_ opcode: fuse_opcode, node: UInt64 = 1, unique: UInt64 = 7, _ body: [UInt8] = []) -> [UInt8] {
        var header = fuse_in_header()
        header.len = UInt32(MemoryLayout<fuse_in_header>.size + body.count)
        header.opcode = opcode.rawValue
        header.unique = unique
        header.nodeid = node
        header.pid = UInt32(getpid())
        return withUnsafeBytes(of: &header) { Array($0) } + body
    }

    static func bytes<T>(_ value: T) -> [UInt8] {
        var copy = value
        return withUnsafeBytes(of: &copy) { Array($0) }
    }

    static func name(_ text: String) -> [UInt8] { Array(text.utf8) + [0] }

    /// Decodes `bytes` (a write's data points into them: checked while they are alive).
    static func decode(_ bytes: [UInt8]) throws(Errno) -> FileSystemRequest {
        let decoded = bytes.withUnsafeBytes { buffer -> Result<FileSystemRequest, Errno> in
            guard let raw = KernelRequest(buffer) else { return .failure(Errno(rawValue: EBADMSG)) }
            do throws(Errno) { return .success(try FileSystemRequest(decoding: raw, maxWrite: maxWrite)) } catch { return .failure(error) }
        }
        return try decoded.get()
    }

    static func decodingError(_ bytes: [UInt8]) -> Int32? {
        do throws(Errno) {
            _ = try decode(bytes)
            return nil
        } catch {
            return error.rawValue
        }
    }

    // MARK: - The decoder

    /// Each opcode's body becomes its typed request: names as bytes, offsets signed, flags as
    /// their system calls have them.
    @Test func requestsDecodeIntoTheirTypes() throws {
        guard case .lookup(let name, let parent) = try Self.decode(Self.message(FUSE_LOOKUP, node: 5, Self.name("héllo"))) else {
            Issue.record("not a lookup"); return
        }
        #expect(name == Array("héllo".utf8) && parent == 5)

        var mkdir = fuse_mkdir_in()
        mkdir.mode = 0o40755
        guard case .makeDirectory(let dir, 1, let mode) = try Self.decode(Self.message(FUSE_MKDIR, Self.bytes(mkdir) + Self.name("d"))) else {
            Issue.record("not a mkdir"); return
        }
        #expect(dir == Array("d".utf8) && mode == 0o40755)

        var rename = fuse_rename2_in()
        rename.newdir = 9
        rename.flags = 2   // RENAME_EXCHANGE
        let renamed = try Self.decode(Self.message(FUSE_RENAME2, node: 3, Self.bytes(rename) + Self.name("a") + Self.name("b")))
        guard case .rename(let old, 3, let new, 9, 2) = renamed else { Issue.record("not a rename: \(renamed)"); return }
        #expect(old == [0x61] && new == [0x62])

        var write = fuse_write_in()
        write.fh = 4
        write.offset = UInt64(bitPattern: 1 << 40)
        write.size = 5
        write.write_flags = cfuse_write_kill_suidgid
        try Self.message(FUSE_WRITE, node: 8, Self.bytes(write) + Array("hello".utf8)).withUnsafeBytes { buffer in
            let written = try FileSystemRequest(decoding: try #require(KernelRequest(buffer)), maxWrite: Self.maxWrite)
            guard case .write(8, 4, 1 << 40, let data, true) = written else { Issue.record("not a write: \(written)"); return }
            #expect(Array(data) == Array("hello".utf8))
        }

        var setattr = fuse_setattr_in()
        setattr.valid = cfuse_fattr_size | cfuse_fattr_fh | cfuse_fattr_mtime | cfuse_fattr_mtime_now | cfuse_fattr_atime
        setattr.size = 12
        setattr.fh = 3
        setattr.atime = UInt64(bitPattern: -5)
        setattr.atimensec = 2_000_000_001
        guard case .setAttributes(1, let change) = try Self.decode(Self.message(FUSE_SETATTR, Self.bytes(setattr))) else {
            Issue.record("not a setattr"); return
        }
        #expect(change == AttributeChange(size: 12, handle: 3, accessTime: .at(seconds: -5, nanoseconds: 1), modificationTime: .now))
        #expect(!change.isSizeOrTouchOnly, "an explicit time is more than a touch")
        #expect(AttributeChange(size: 12, handle: 3, modificationTime: .now).isSizeOrTouchOnly)

        var setxattr = [UInt8]()
        setxattr += Self.bytes(UInt32(3)) + Self.bytes(UInt32(1))   // size, XATTR_CREATE
        setxattr += Self.name("user.note") + Array("abc".utf8)
        guard case .setExtendedAttribute(1, let attribute, let value, 1) = try Self.decode(Self.message(FUSE_SETXATTR, setxattr)) else {
            Issue.record("not a setxattr"); return
        }
        #expect(attribute == Array("user.note".utf8) && value == Array("abc".utf8))

        var read = fuse_read_in()
        read.size = UInt32(Self.maxWrite * 4)
        guard case .read(_, _, _, let size) = try Self.decode(Self.message(FUSE_READ, Self.bytes(read))) else { Issue.record("not a read"); return }
        #expect(size == Self.maxWrite, "a READ is never answered with more than the mount's largest message")

        guard case .unknown(9999) = try Self.decode(Self.message(fuse_opcode(rawValue: 9999))) else { Issue.record("not unknown"); return }
    }

    /// A name that is not one path component, or has no end, is refused before any operation
    /// sees it — as is a body shorter than its structure, or a write that says more than it
    /// carries or more than the mount allows.
    @Test func malformedRequestsAreRefusedWithTheirErrno() {
        var mkdir = fuse_mkdir_in()
        mkdir.mode = 0o40755
        let names: [([UInt8], Int32)] = [
            (Array("a/b".utf8) + [0], EINVAL), (Self.name(".."), EINVAL), (Self.name("."), EINVAL), ([0], EINVAL),
            (Array("no-end".utf8), EINVAL), (Self.name(String(repeating: "x", count: 256)), ENAMETOOLONG),
        ]
        for (name, code) in names {
            #expect(Self.decodingError(Self.message(FUSE_LOOKUP, name)) == code, "\(name.prefix(10))")
            #expect(Self.decodingError(Self.message(FUSE_MKDIR, Self.bytes(mkdir) + name)) == code)
            #expect(Self.decodingError(Self.message(FUSE_UNLINK, name)) == code)
        }
        #expect(Self.decodingError(Self.message(FUSE_LOOKUP, Self.name(String(repeating: "x", count: 255)))) == nil)
        // A NUL inside: the name ends there, and what follows is not a second name.
        var rename = fuse_rename_in()
        rename.newdir = 1
        #expect(Self.decodingError(Self.message(FUSE_RENAME, Self.bytes(rename) + Self.name("a"))) == EINVAL, "no second name")
        #expect(Self.decodingError(Self.message(FUSE_RENAME, Self.bytes(rename) + Self.name("a") + Self.name("b/c"))) == EINVAL)
        // Bodies shorter than their structures.
        for opcode in [FUSE_MKDIR, FUSE_MKNOD, FUSE_SETATTR, FUSE_OPEN, FUSE_CREATE, FUSE_READ, FUSE_WRITE, FUSE_RELEASE, FUSE_FSYNC,
                       FUSE_FALLOCATE, FUSE_GETXATTR, FUSE_SETXATTR, FUSE_LINK, FUSE_RENAME2, FUSE_INIT, FUSE_FORGET, FUSE_ACCESS] {
            #expect(Self.decodingError(Self.message(opcode, [1, 2, 3])) == EINVAL, "opcode \(opcode.rawValue)")
        }
        var write = fuse_write_in()
        write.size = 10
        #expect(Self.decodingError(Self.message(FUSE_WRITE, Self.bytes(write) + Array("short".utf8))) == EINVAL)
        write.size = UInt32(Self.maxWrite + 1)
        #expect(Self.decodingError(Self.message(FUSE_WRITE, Self.bytes(write) + [UInt8](repeating: 0, count: Self.maxWrite + 1))) == EINVAL,
                "past max_write")
        // SETXATTR: a value longer than the body; a name past XATTR_NAME_MAX.
        let longValue = Self.bytes(UInt32(100)) + Self.bytes(UInt32(0)) + Self.name("user.x") + Array("abc".utf8)
        #expect(Self.decodingError(Self.message(FUSE_SETXATTR, longValue)) == EINVAL)
        var getxattr = fuse_getxattr_in()
        getxattr.size = 10
        #expect(Self.decodingError(Self.message(FUSE_GETXATTR, Self.bytes(getxattr) + Self.name("user." + String(repeating: "x", count: 300)))) == ERANGE)
        // A BATCH_FORGET that claims more entries than it carries: only those it carries.
        var batch = fuse_batch_forget_in()
        batch.count = 1000
        var one = fuse_forget_one()
        one.nodeid = 5
        one.nlookup = 2
        guard case .forget(let forgotten)? = try? Self.decode(Self.message(FUSE_BATCH_FORGET, Self.bytes(batch) + Self.bytes(one))) else {
            Issue.record("not a forget"); return
        }
        #expect(forgotten.count == 1 && forgotten[0].node == 5 && forgotten[0].count == 2)
        // A header whose length is not the message's: no request at all (nothing to answer).
        var bytes = Self.message(FUSE_LOOKUP, Self.name("a"))
        bytes.removeLast()
        #expect(bytes.withUnsafeBytes { KernelRequest($0) } == nil)
        #expect([UInt8](repeating: 0, count: 10).withUnsafeBytes { KernelRequest($0) } == nil)
    }

    // MARK: - The operations, through a session

    /// A session on a fresh protected file system; replies come out of `peer`.
    final class Served {
        let fileSystem: ProtectedFileSystem
        let session: KernelSession
        let peer: Int32
        let directory: String

        init(reservedNames: Set<String> = [], refusesSetID: Bool = false) async throws {
            let base = temporaryDirectory()
            let keybag = try await Keybag.create(root: base.appendingPathComponent("root").path, passcode: nil, kdf: .insecureFastForTesting)
            directory = base.appendingPathComponent("served").path
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            fileSystem = try ProtectedFileSystem(
                directory: directory, files: ProtectedFileManager(keybag: keybag), refusesSetID: refusesSetID,
                reservedNames: reservedNames)
            var pair: [Int32] = [0, 0]
            guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
                throw Errno(rawValue: errno)
            }
            peer = pair[1]
            session = KernelSession(operations: fileSystem, replier: KernelReplier(fd: pair[0]), interrupts: InterruptedRequests(),
                                    maxWrite: KernelSessionTests.maxWrite)
        }

        deinit {
            close(peer)
            close(session.replier.fd)
        }

        /// Sends one message; returns the reply's errno (0: success) and body, `nil` when there
        /// is none.
        @discardableResult
        func send(_ bytes: [UInt8]) -> (error: Int32, body: [UInt8])? {
            var copy = bytes   // the session may clear a written payload in place
            copy.withUnsafeMutableBytes { session.answer(UnsafeRawBufferPointer($0)) }
            var reply = [UInt8](repeating: 0, count: 1 << 21)
            let n = recv(peer, &reply, reply.count, Int32(MSG_DONTWAIT))
            guard n >= MemoryLayout<fuse_out_header>.size else { return nil }
            let header = reply.withUnsafeBytes { $0.loadUnaligned(as: fuse_out_header.self) }
            #expect(Int(header.len) == n, "a reply's length is the header's")
            return (-header.error, Array(reply[MemoryLayout<fuse_out_header>.size..<n]))
        }

        func reply<T>(_ bytes: [UInt8], as type: T.Type) throws -> T {
            let reply = try #require(send(bytes))
            #expect(reply.error == 0, "errno \(reply.error)")
            try #require(reply.body.count >= MemoryLayout<T>.size)
            return reply.body.withUnsafeBytes { $0.loadUnaligned(as: T.self) }
        }
    }

    /// INIT, then a directory, a file created, written, read back and listed, its class read
    /// as an attribute — all through request bytes; on disk, the file is a protected file.
    @Test func operationsAnswerRequestBytesWithoutAMount() async throws {
        let served = try await Served()
        var initIn = fuse_init_in()
        initIn.major = cfuse_major
        initIn.minor = 40
        initIn.flags = cfuse_async_read | cfuse_export_support
        let initialized = try served.reply(Self.message(FUSE_INIT, Self.bytes(initIn)), as: fuse_init_out.self)
        #expect(initialized.major == cfuse_major && initialized.minor == min(40, cfuse_minor))
        #expect(initialized.max_write == UInt32(Self.maxWrite))
        #expect(initialized.flags == cfuse_async_read, "only what the server asks for, of what the kernel offers")

        var mkdir = fuse_mkdir_in()
        mkdir.mode = 0o750
        let directory = try served.reply(Self.message(FUSE_MKDIR, Self.bytes(mkdir) + Self.name("notes")), as: fuse_entry_out.self)
        #expect(directory.attr.mode & S_IFMT == S_IFDIR && directory.attr.mode & 0o7777 == 0o750)

        var create = fuse_create_in()
        create.flags = UInt32(O_RDWR | O_CREAT)
        create.mode = 0o640
        let made = try #require(served.send(Self.message(FUSE_CREATE, node: directory.nodeid, Self.bytes(create) + Self.name("today.txt"))))
        #expect(made.error == 0)
        let entry = made.body.withUnsafeBytes { $0.loadUnaligned(as: fuse_entry_out.self) }
        let opened = made.body.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: MemoryLayout<fuse_entry_out>.size, as: fuse_open_out.self) }

        let text = Array("a secret note".utf8)
        var write = fuse_write_in()
        write.fh = opened.fh
        write.size = UInt32(text.count)
        let written = try served.reply(Self.message(FUSE_WRITE, node: entry.nodeid, Self.bytes(write) + text), as: fuse_write_out.self)
        #expect(written.size == UInt32(text.count))

        var read = fuse_read_in()
        read.fh = opened.fh
        read.size = 4096
        #expect(served.send(Self.message(FUSE_READ, node: entry.nodeid, Self.bytes(read)))?.body == text)

        let attributes = try served.reply(Self.message(FUSE_GETATTR, node: entry.nodeid, Self.bytes(fuse_getattr_in())), as: fuse_attr_out.self)
        #expect(attributes.attr.size == UInt64(text.count), "the plaintext size")

        var getxattr = fuse_getxattr_in()
        let className = Self.bytes(getxattr) + Self.name(ProtectedFileSystem.classAttribute)
        let sized = try served.reply(Self.message(FUSE_GETXATTR, node: entry.nodeid, className), as: fuse_getxattr_out.self)
        getxattr.size = sized.size
        let cls = try #require(served.send(Self.message(FUSE_GETXATTR, node: entry.nodeid, Self.bytes(getxattr) + Self.name(ProtectedFileSystem.classAttribute))))
        #expect(ProtectionClass(name: String(decoding: cls.body, as: UTF8.self)) != nil, "\(cls)")
        getxattr.size = 1
        #expect(served.send(Self.message(FUSE_GETXATTR, node: entry.nodeid, Self.bytes(getxattr) + Self.name(ProtectedFileSystem.classAttribute)))?.error == ERANGE)

        var release = fuse_release_in()
        release.fh = opened.fh
        #expect(served.send(Self.message(FUSE_RELEASE, node: entry.nodeid, Self.bytes(release)))?.error == 0)

        let listing = try served.reply(Self.message(FUSE_OPENDIR, node: directory.nodeid, Self.bytes(fuse_open_in())), as: fuse_open_out.self)
        read.fh = listing.fh
        read.size = 4096
        let entries = try #require(served.send(Self.message(FUSE_READDIR, node: directory.nodeid, Self.bytes(read))))
        #expect(entries.error == 0)
        #expect(Self.names(inListing: entries.body).sorted() == [".", "..", "today.txt"])

        let onDisk = try Data(contentsOf: URL(fileURLWithPath: served.directory + "/notes/today.txt"))
        #expect(onDisk.count > text.count && onDisk.range(of: Data(text)) == nil, "protected at rest")
    }

    /// What the server answers whatever the file system: FLUSH and unknown opcodes `ENOSYS`
    /// (the kernel stops asking), IOCTL `ENOTTY`; FORGET and INTERRUPT get no answer; a name
    /// that is not one component gets `EINVAL` from the session, before any operation; a
    /// message whose header lies about its length gets nothing.
    @Test func theSessionAnswersWhatNoOperationSees() async throws {
        let served = try await Served()
        #expect(served.send(Self.message(FUSE_FLUSH, Self.bytes(fuse_flush_in())))?.error == ENOSYS)
        #expect(served.send(Self.message(fuse_opcode(rawValue: 4242)))?.error == ENOSYS)
        #expect(served.send(Self.message(FUSE_IOCTL))?.error == ENOTTY)
        var forget = fuse_forget_in()
        forget.nlookup = 1
        #expect(served.send(Self.message(FUSE_FORGET, node: 12345, Self.bytes(forget))) == nil)
        #expect(served.send(Self.message(FUSE_FORGET, node: 12345, [1, 2])) == nil, "malformed, and still unanswered")
        #expect(served.send(Self.message(FUSE_INTERRUPT, [1])) == nil)
        var interrupt = fuse_interrupt_in()
        interrupt.unique = 99
        #expect(served.send(Self.message(FUSE_INTERRUPT, Self.bytes(interrupt))) == nil)
        #expect(served.session.interrupts.contains(99))
        #expect(served.send(Self.message(FUSE_LOOKUP, Self.name("..")))?.error == EINVAL)
        #expect(served.send(Self.message(FUSE_LOOKUP, Self.name("missing")))?.error == ENOENT)
        #expect(served.send(Self.message(FUSE_LOOKUP, node: 777, Self.name("x")))?.error == ESTALE, "a node never given")
        var truncated = Self.message(FUSE_LOOKUP, Self.name("a"))
        truncated.removeLast()
        #expect(served.send(truncated) == nil)
        // A handle never given, and an allocation past the largest offset.
        var read = fuse_read_in()
        read.fh = 31337
        read.size = 10
        #expect(served.send(Self.message(FUSE_READ, Self.bytes(read)))?.error == EBADF)
        var create = fuse_create_in()
        create.flags = UInt32(O_RDWR | O_CREAT)
        create.mode = 0o600
        let made = try #require(served.send(Self.message(FUSE_CREATE, Self.bytes(create) + Self.name("f"))))
        let entry = made.body.withUnsafeBytes { $0.loadUnaligned(as: fuse_entry_out.self) }
        let opened = made.body.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: MemoryLayout<fuse_entry_out>.size, as: fuse_open_out.self) }
        var allocate = fuse_fallocate_in()
        allocate.fh = opened.fh
        allocate.offset = UInt64(Int64.max - 10)
        allocate.length = 100
        #expect(served.send(Self.message(FUSE_FALLOCATE, node: entry.nodeid, Self.bytes(allocate)))?.error == EFBIG)
        allocate.offset = UInt64(bitPattern: -1)
        #expect(served.send(Self.message(FUSE_FALLOCATE, node: entry.nodeid, Self.bytes(allocate)))?.error == EINVAL)
    }

    /// Policy without a mount: reserved names cannot be made or removed, set-ID bits are refused
    /// where asked, and the class attribute is served by name, never listed, kept when removed
    /// from a file, and a class set on a file is the one read back.
    @Test func policyAnswersWithoutAMount() async throws {
        let served = try await Served(reservedNames: ["meta"], refusesSetID: true)
        var mkdir = fuse_mkdir_in()
        mkdir.mode = 0o755
        #expect(served.send(Self.message(FUSE_MKDIR, Self.bytes(mkdir) + Self.name("meta")))?.error == EPERM)
        #expect(served.send(Self.message(FUSE_UNLINK, Self.name("meta")))?.error == EPERM)
        var create = fuse_create_in()
        create.flags = UInt32(O_RDWR | O_CREAT)
        create.mode = 0o4755
        #expect(served.send(Self.message(FUSE_CREATE, Self.bytes(create) + Self.name("setuid")))?.error == EPERM)
        create.mode = 0o644
        let made = try #require(served.send(Self.message(FUSE_CREATE, Self.bytes(create) + Self.name("f"))))
        #expect(made.error == 0)
        let entry = made.body.withUnsafeBytes { $0.loadUnaligned(as: fuse_entry_out.self) }
        let opened = made.body.withUnsafeBytes {
            $0.loadUnaligned(fromByteOffset: MemoryLayout<fuse_entry_out>.size, as: fuse_open_out.self)
        }
        var release = fuse_release_in()
        release.fh = opened.fh
        _ = served.send(Self.message(FUSE_RELEASE, node: entry.nodeid, Self.bytes(release)))

        let classAttribute = Self.name(ProtectedFileSystem.classAttribute)
        let setClass = Self.bytes(UInt32(1)) + Self.bytes(UInt32(0)) + classAttribute + Array("A".utf8)
        #expect(served.send(Self.message(FUSE_SETXATTR, node: entry.nodeid, setClass))?.error == 0)
        var getxattr = fuse_getxattr_in()
        getxattr.size = 64
        let read = served.send(Self.message(FUSE_GETXATTR, node: entry.nodeid, Self.bytes(getxattr) + classAttribute))
        #expect(read.map { String(decoding: $0.body, as: UTF8.self) } == ProtectionClass.complete.shortName)
        let userNote = Self.bytes(UInt32(2)) + Self.bytes(UInt32(0)) + Self.name("user.note") + Array("hi".utf8)
        #expect(served.send(Self.message(FUSE_SETXATTR, node: entry.nodeid, userNote))?.error == 0)
        let listed = try #require(served.send(Self.message(FUSE_LISTXATTR, node: entry.nodeid, Self.bytes(getxattr))))
        #expect(listed.body.split(separator: 0).map { String(decoding: $0, as: UTF8.self) } == ["user.note"])
        #expect(served.send(Self.message(FUSE_REMOVEXATTR, node: entry.nodeid, classAttribute))?.error == 0)
        let kept = served.send(Self.message(FUSE_GETXATTR, node: entry.nodeid, Self.bytes(getxattr) + classAttribute))
        #expect(kept.map { String(decoding: $0.body, as: UTF8.self) } == ProtectionClass.complete.shortName, "a file always has a class")
        // A value longer than a first read's buffer comes back whole, and its size alone when asked.
        let long = [UInt8]((0..<1_000).map { UInt8($0 % 251) })
        let setLong = Self.bytes(UInt32(long.count)) + Self.bytes(UInt32(0)) + Self.name("user.long") + long
        #expect(served.send(Self.message(FUSE_SETXATTR, node: entry.nodeid, setLong))?.error == 0)
        let sizeOnly = try served.reply(
            Self.message(FUSE_GETXATTR, node: entry.nodeid, Self.bytes(fuse_getxattr_in()) + Self.name("user.long")),
            as: fuse_getxattr_out.self)
        #expect(sizeOnly.size == 1_000)
        getxattr.size = 4_096
        #expect(served.send(Self.message(FUSE_GETXATTR, node: entry.nodeid, Self.bytes(getxattr) + Self.name("user.long")))?.body == long)
        getxattr.size = 64
        // Other namespaces are not served.
        let security = Self.bytes(UInt32(1)) + Self.bytes(UInt32(0)) + Self.name("security.x") + [1]
        #expect(served.send(Self.message(FUSE_SETXATTR, node: entry.nodeid, security))?.error == EOPNOTSUPP)
        #expect(served.send(Self.message(FUSE_GETXATTR, node: entry.nodeid, Self.bytes(getxattr) + Self.name("trusted.y")))?.error == ENODATA)
    }

    /// Truncation through a handle (SETATTR with a size and `FATTR_FH`), renames and READDIRPLUS,
    /// as the kernel sends them: sizes are the plaintext's, and a renamed file is found under its
    /// new name with the same node.
    @Test func sizesRenamesAndListingsWithoutAMount() async throws {
        let served = try await Served()
        var create = fuse_create_in()
        create.flags = UInt32(O_RDWR | O_CREAT)
        create.mode = 0o600
        let made = try #require(served.send(Self.message(FUSE_CREATE, Self.bytes(create) + Self.name("a"))))
        let entry = made.body.withUnsafeBytes { $0.loadUnaligned(as: fuse_entry_out.self) }
        let opened = made.body.withUnsafeBytes {
            $0.loadUnaligned(fromByteOffset: MemoryLayout<fuse_entry_out>.size, as: fuse_open_out.self)
        }
        var write = fuse_write_in()
        write.fh = opened.fh
        write.size = 10_000
        _ = try served.reply(Self.message(FUSE_WRITE, node: entry.nodeid, Self.bytes(write) + [UInt8](repeating: 7, count: 10_000)),
                             as: fuse_write_out.self)
        var truncate = fuse_setattr_in()
        truncate.valid = cfuse_fattr_size | cfuse_fattr_fh
        truncate.size = 1_234
        truncate.fh = opened.fh
        let attributes = try served.reply(Self.message(FUSE_SETATTR, node: entry.nodeid, Self.bytes(truncate)), as: fuse_attr_out.self)
        #expect(attributes.attr.size == 1_234)
        var release = fuse_release_in()
        release.fh = opened.fh
        _ = served.send(Self.message(FUSE_RELEASE, node: entry.nodeid, Self.bytes(release)))

        var rename = fuse_rename2_in()
        rename.newdir = 1
        rename.flags = 1   // RENAME_NOREPLACE
        #expect(served.send(Self.message(FUSE_RENAME2, Self.bytes(rename) + Self.name("a") + Self.name("b")))?.error == 0)
        let found = try served.reply(Self.message(FUSE_LOOKUP, Self.name("b")), as: fuse_entry_out.self)
        #expect(found.nodeid == entry.nodeid && found.attr.size == 1_234)
        #expect(served.send(Self.message(FUSE_LOOKUP, Self.name("a")))?.error == ENOENT)

        let directory = try served.reply(Self.message(FUSE_OPENDIR, Self.bytes(fuse_open_in())), as: fuse_open_out.self)
        var read = fuse_read_in()
        read.fh = directory.fh
        read.size = 4096
        let plus = try #require(served.send(Self.message(FUSE_READDIRPLUS, Self.bytes(read))))
        // Each record: fuse_entry_out, then fuse_dirent and its name, padded to 8 bytes.
        var at = 0, names: [String: UInt64] = [:]
        while at + MemoryLayout<fuse_entry_out>.size + 24 <= plus.body.count {
            let node = plus.body.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at, as: fuse_entry_out.self).nodeid }
            let direntAt = at + MemoryLayout<fuse_entry_out>.size
            let length = Int(plus.body.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: direntAt + 16, as: UInt32.self) })
            names[String(decoding: plus.body[(direntAt + 24)..<(direntAt + 24 + length)], as: UTF8.self)] = node
            at += (MemoryLayout<fuse_entry_out>.size + 24 + length + 7) & ~7
        }
        #expect(names["b"] == entry.nodeid && names["."] == 0 && names[".."] == 0, "\(names)")
    }

    /// Hostile bytes: thousands of messages with random opcodes and random bodies (names with NUL
    /// and `/` anywhere, random handles and nodes, short and long bodies) never crash the server,
    /// every answer is a well-formed reply, and the session answers a plain LOOKUP afterwards.
    @Test func randomMessagesAreAnsweredOrDroppedNeverACrash() async throws {
        let served = try await Served()
        FileManager.default.createFile(atPath: served.directory + "/known", contents: Data("k".utf8))
        var generator = SystemRandomNumberGenerator()
        var answered = 0
        for round in 0..<5_000 {
            let opcode = fuse_opcode(rawValue: UInt32.random(in: 1...60, using: &generator))
            // Never FALLOCATE or SETATTR with a size on a real handle: handles are random, so
            // these only ever meet EBADF or ESTALE; a random size is kept small regardless.
            var body = (0..<Int.random(in: 0...160, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            if round % 3 == 0, !body.isEmpty { body[Int.random(in: 0..<body.count, using: &generator)] = 0 }
            if round % 5 == 0 { body += Array("a/b\0..\0".utf8) }
            let node: UInt64 = round % 4 == 0 ? 1 : UInt64.random(in: 0...UInt64.max, using: &generator)
            var message = Self.message(opcode, node: node, unique: UInt64(round + 1), body)
            if opcode == FUSE_SETATTR || opcode == FUSE_FALLOCATE || opcode == FUSE_WRITE || opcode == FUSE_INIT {
                message = Self.message(opcode, node: node, unique: UInt64(round + 1), Array(body.prefix(8)))
            }
            if let reply = served.send(message) {
                answered += 1
                #expect(reply.error >= 0 && reply.error < 4096, "opcode \(opcode.rawValue): errno \(reply.error)")
            }
        }
        #expect(answered > 1_000)
        let found = try served.reply(Self.message(FUSE_LOOKUP, Self.name("known")), as: fuse_entry_out.self)
        #expect(found.nodeid != 0 && found.attr.size == 1)
    }

    /// The names in a READDIR answer (`fuse_dirent` records).
    static func names(inListing bytes: [UInt8]) -> [String] {
        var names: [String] = []
        var at = 0
        while at + 24 <= bytes.count {
            let length = Int(bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at + 16, as: UInt32.self) })
            names.append(String(decoding: bytes[(at + 24)..<(at + 24 + length)], as: UTF8.self))
            at += (24 + length + 7) & ~7
        }
        return names
    }
}
