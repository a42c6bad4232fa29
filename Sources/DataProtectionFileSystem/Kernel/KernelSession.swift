import CFUSEKernel
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The protocol half of a mount: takes each message the kernel sends, decodes it
/// (``FileSystemRequest``), asks the ``FileSystemOperations``, and writes the answer — the
/// operation's result encoded, or its errno. INIT, INTERRUPT and the calls this server answers
/// the same way whatever the file system (FLUSH, IOCTL, unknown opcodes) are answered here.
///
/// Nothing here needs `/dev/fuse`: ``answer(_:)`` takes a message's bytes and writes the reply
/// to ``replier``'s descriptor, whatever it is (a socket in tests).
struct KernelSession: Sendable {
    let operations: any FileSystemOperations
    let replier: KernelReplier
    let interrupts: InterruptedRequests
    /// The largest WRITE the kernel may send (said at INIT).
    let maxWrite: Int

    /// Answers the message in `bytes` (every reply is written before this returns, except for
    /// those the protocol does not answer: FORGET, BATCH_FORGET, INTERRUPT). A message whose
    /// header does not hold together is dropped (it cannot be answered).
    ///
    /// - Parameter beginning: called with the decoded header before the operation runs (the
    ///   serving thread records who asks).
    func answer(_ bytes: UnsafeRawBufferPointer, beginning: (KernelRequest) -> Void = { _ in }) {
        guard let raw = KernelRequest(bytes) else { return }
        beginning(raw)
        let unique = raw.unique
        do throws(Errno) {
            let request = try FileSystemRequest(decoding: raw, maxWrite: maxWrite)
            if case .interrupt(let interrupted) = request { return interrupts.insert(interrupted) }
            try answer(request, unique: unique)
        } catch {
            // FORGET, BATCH_FORGET and INTERRUPT are never answered, not even when malformed: the
            // kernel waits for no reply, and one would reach it as a notification.
            if !Self.unanswered.contains(raw.opcode) { replier.reply(unique, error: error.rawValue) }
        }
        interrupts.answered(unique)
    }

    /// The opcodes the protocol does not answer.
    static let unanswered: Set<UInt32> = [FUSE_FORGET.rawValue, FUSE_BATCH_FORGET.rawValue, FUSE_INTERRUPT.rawValue]

    private func answer(_ request: FileSystemRequest, unique: UInt64) throws(Errno) {
        let context = RequestContext(unique: unique, interrupts: interrupts)
        let ops = operations
        switch request {
        case .initialize(let major, let minor, let maxReadahead, let flags):
            replier.reply(
                unique,
                Self.initialized(
                    major: major, minor: minor, maxReadahead: maxReadahead, flags: flags, maxWrite: maxWrite))
        case .destroy: replier.reply(unique)
        case .forget(let nodes): for (node, count) in nodes { ops.forget(node, count: count) }
        case .interrupt: break   // recorded by the caller
        case .lookup(let name, let parent):
            replier.reply(unique, KernelReplier.encode(try ops.lookup(name, in: parent)))
        case .getAttributes(let node): replier.reply(unique, KernelReplier.encode(try ops.attributes(of: node)))
        case .checkAccess(let node, let mask):
            try ops.checkAccess(node, mask: mask)
            replier.reply(unique)
        case .setAttributes(let node, let change):
            replier.reply(unique, KernelReplier.encode(try ops.setAttributes(change, of: node, context)))
        case .readLink(let node):
            let target = try ops.readLink(node)
            target.withUnsafeBytes { replier.reply(unique, [$0]) }
        case .symbolicLink(let name, let parent, let target):
            replier.reply(unique, KernelReplier.encode(try ops.symbolicLink(name, in: parent, to: target)))
        case .makeNode(let name, let parent, let mode):
            replier.reply(unique, KernelReplier.encode(try ops.makeNode(name, in: parent, mode: mode)))
        case .makeDirectory(let name, let parent, let mode):
            replier.reply(unique, KernelReplier.encode(try ops.makeDirectory(name, in: parent, mode: mode)))
        case .remove(let name, let parent, let directory):
            try ops.remove(name, in: parent, directory: directory)
            replier.reply(unique)
        case .rename(let name, let parent, let newName, let newParent, let flags):
            try ops.rename(name, in: parent, to: newName, in: newParent, flags: flags)
            replier.reply(unique)
        case .link(let node, let name, let newParent):
            replier.reply(unique, KernelReplier.encode(try ops.link(node, as: name, in: newParent)))
        case .open(let node, let options):
            replier.reply(unique, Self.opened(try ops.openFile(node, options)))
        case .create(let name, let parent, let mode, let options):
            let (entry, handle) = try ops.createFile(name, in: parent, mode: mode, options)
            replier.reply(unique, KernelReplier.encode(entry), Self.opened(handle))
        case .read(let node, let handle, let offset, let size):
            let data = try ops.read(node, handle: handle, at: offset, count: size)
            data.withUnsafeBytes { replier.reply(unique, [$0]) }
        case .write(let node, let handle, let offset, let data, let killsSetID):
            var out = fuse_write_out()
            out.size = UInt32(try ops.write(node, handle: handle, data, at: offset, killsSetID: killsSetID, context))
            replier.reply(unique, out)
        // Nothing to do at a close: every WRITE is written when answered, and locks are the
        // kernel's. ENOSYS makes the kernel stop asking (one round trip less per close).
        case .flush: throw Errno(rawValue: ENOSYS)
        case .release(let node, let handle):
            ops.release(node, handle: handle)
            replier.reply(unique)
        case .synchronize(let node, let handle, let dataOnly):
            try ops.synchronize(node, handle: handle, dataOnly: dataOnly)
            replier.reply(unique)
        case .allocate(let node, let handle, let offset, let length, let mode):
            try ops.allocate(node, handle: handle, at: offset, length: length, mode: mode, context)
            replier.reply(unique)
        case .fileSystemStatus(let node): replier.reply(unique, KernelReplier.encode(try ops.fileSystemStatus(node)))
        case .openDirectory(let node): replier.reply(unique, Self.opened(try ops.openDirectory(node)))
        case .readDirectory(let node, let handle, let offset, let size, let plus):
            var listing = DirectoryListing(capacity: size, plus: plus)
            try ops.readDirectory(node, handle: handle, from: offset, into: &listing)
            listing.bytes.withUnsafeBytes { replier.reply(unique, [$0]) }
        case .releaseDirectory(let node, let handle):
            ops.releaseDirectory(node, handle: handle)
            replier.reply(unique)
        case .synchronizeDirectory(let node, let handle, let dataOnly):
            try ops.synchronizeDirectory(node, handle: handle, dataOnly: dataOnly)
            replier.reply(unique)
        case .getExtendedAttribute(let node, let name, let size):
            try replySized(unique, try ops.extendedAttribute(name, of: node), asked: size)
        case .setExtendedAttribute(let node, let name, let value, let flags):
            try ops.setExtendedAttribute(name, of: node, to: value, flags: flags)
            replier.reply(unique)
        case .listExtendedAttributes(let node, let size):
            try replySized(unique, try ops.extendedAttributeNames(of: node).flatMap { $0 + [0] }, asked: size)
        case .removeExtendedAttribute(let node, let name):
            try ops.removeExtendedAttribute(name, of: node)
            replier.reply(unique)
        case .ioctl: throw Errno(rawValue: ENOTTY)   // not remembered by the kernel: the cheapest answer
        case .unknown: throw Errno(rawValue: ENOSYS)   // the kernel remembers it for most calls
        }
    }

    /// GETXATTR's and LISTXATTR's answer: the size alone when asked with size 0, else the bytes
    /// (`ERANGE` when they do not fit).
    private func replySized(_ unique: UInt64, _ bytes: [UInt8], asked size: Int) throws(Errno) {
        if size == 0 {
            var out = fuse_getxattr_out()
            out.size = UInt32(bytes.count)
            return replier.reply(unique, out)
        }
        guard bytes.count <= size else { throw Errno(rawValue: ERANGE) }
        bytes.withUnsafeBytes { replier.reply(unique, [$0]) }
    }

    private static func opened(_ handle: UInt64) -> fuse_open_out {
        var out = fuse_open_out()
        out.fh = handle
        return out
    }

    /// INIT's answer: this server's protocol version and what it asks for of what the kernel
    /// offers. An older or newer major: ours alone, and the kernel gives up.
    static func initialized(
        major: UInt32, minor: UInt32, maxReadahead: UInt32, flags: UInt32, maxWrite: Int
    ) -> fuse_init_out {
        var out = fuse_init_out()
        out.major = cfuse_major
        out.minor = cfuse_minor
        guard major == cfuse_major else { return out }
        out.minor = min(minor, cfuse_minor)
        out.max_readahead = maxReadahead
        let wanted =
            cfuse_async_read | cfuse_atomic_o_trunc | cfuse_big_writes | cfuse_max_pages | cfuse_parallel_dirops
            | cfuse_handle_killpriv_v2 | cfuse_do_readdirplus | cfuse_readdirplus_auto
        out.flags = flags & wanted
        out.max_background = 64
        out.congestion_threshold = 48
        out.max_write = UInt32(maxWrite)
        out.time_gran = 1
        out.max_pages = UInt16(maxWrite / 4096)
        return out
    }
}
