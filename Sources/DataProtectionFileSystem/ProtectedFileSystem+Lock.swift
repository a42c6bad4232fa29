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

extension ProtectedFileSystem {
    struct Observers: Sendable { let discard: UUID, events: UUID, returns: UUID? }

    /// Follows the keybag: a discarded class key locks the class's files on the mount; an
    /// unlock makes them available again.
    func observeLockState(replier: KernelReplier) async -> Observers {
        let keybag = files.keybag
        let discard = await keybag.addDiscardObserver { [self] cls in
            // Class B keeps the keys of open files (as iOS does): nothing to take back.
            guard cls != .completeUnlessOpen else { return }
            lock(cls, replier: replier)
        }
        let events = await keybag.addObserver { [self] event in
            if event == .didBecomeAvailable { gate.reset() }
        }
        // A keybagd back after a restart, locked again after its first unlock by then: class C,
        // closed when the daemon went, is open again (class A comes with didBecomeAvailable).
        let returns = await keybag.addReturnObserver { [self] available in
            if available.contains(.completeUntilFirstUserAuthentication) {
                gate.set(.completeUntilFirstUserAuthentication, .available)
            }
        }
        return Observers(discard: discard, events: events, returns: returns)
    }

    func stopObserving(_ observers: Observers) async {
        await files.keybag.removeDiscardObserver(observers.discard)
        await files.keybag.removeObserver(observers.events)
        if let returns = observers.returns { await files.keybag.removeDiscardObserver(returns) }
    }

    /// Applies the lock of `cls` to the mount, in the order that loses nothing: (1) refuse opens
    /// and reads, (2) drop the pages the kernel holds of the class's files — on a thread that
    /// serves no request, since the kernel first writes dirty mapped pages back through WRITE
    /// requests, which still succeed — (3) refuse writes and drop the files' keys.
    func lock(_ cls: ProtectionClass, replier: KernelReplier) {
        gate.set(cls, .draining)
        let thread = Thread { [self] in
            for node in nodes.all where node.isRegularFile && mayHoldPages(of: node, cls) {
                replier.invalidate(node: node.id)
            }
            gate.set(cls, .locked)
            for node in nodes.all where node.isRegularFile {
                node.open.withLock { file in
                    if file.protectionClass == cls {
                        if file.writable { try? file.engine?.settle() }
                        file.engine = nil
                        file.mayHavePages = false
                    }
                }
            }
            logger.info("class \(cls.shortName) locked on the mount of \(directory)")
        }
        thread.start()
    }

    /// Whether the kernel may hold pages of `node` that `cls`'s lock must drop: an open file of
    /// that class that was read or written; a closed file unless it is known, at its current
    /// length and change time, to be of another class or plain (a closed file's pages stay in the
    /// page cache).
    private func mayHoldPages(of node: FileNode, _ cls: ProtectionClass) -> Bool {
        let open = node.open.withLock { $0.handles > 0 ? ($0.protectionClass == cls && $0.mayHavePages) : nil }
        if let open { return open }
        guard let st = try? node.status() else { return true }
        switch kinds.kind(of: st) {
        case .protected(let prefix)?: return prefix.protectionClass == cls
        case .plain?, .damaged?: return false
        case nil: return true
        }
    }

    /// Whether files of `cls` may be opened now: the mount's gate, then the keybag (class B
    /// while locked, C before the first unlock, A after lock + grace: refused).
    func mayOpen(_ cls: ProtectionClass) -> Bool {
        guard gate.mayRead(cls) else { return false }
        if cls == .noProtection { return true }
        return (try? runBlocking { [files] in try await files.keybag.generation(of: cls) }) != nil
    }
}
