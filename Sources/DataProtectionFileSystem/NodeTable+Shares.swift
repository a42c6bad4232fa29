import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Sharing the table among apps (``NodeTable/sharedByRequester``).
///
/// Every node counts in the share of the program whose request made it: an admitted app's
/// (``ServedApps``: one share for all its runs, so a relaunched app finds its earlier runs'
/// directories the kernel still holds in its own share), else its PID namespace's — each
/// sandbox has one of its own and may not make more (no user namespace is left to it); the
/// host's for every program outside a sandbox. While a namespace holds nodes, the server keeps
/// a descriptor of it, so that its inode number never goes to another namespace meanwhile (a
/// new sandbox never inherits a gone one's count).
///
/// A program may make a node while it holds fewer than 2/(*k* + 2) of ``NodeTable/capacity``,
/// *k* counting it and every other program holding at least a sixteenth of the table: alone,
/// two thirds; beside one flood, half — and at least the third the flood left. Programs holding
/// little (an app gone, its last directories still known to the kernel) do not shrink the others'
/// shares. What one program holds open, keeps mapped or pins (an `O_PATH` descriptor) stays
/// within its share: the kernel forgets none of it while held, but nothing beyond the share is made.
extension NodeTable {
    /// A program charged with nodes.
    struct Owner {
        /// Its key: its PID namespace's inode number (0: not known), or its app's
        /// (``ServedApps/appOwnerBit`` set).
        let key: UInt64
        /// Nodes it holds, and nodes reserved for its makes under way.
        var held: Int
        /// A descriptor of the namespace while it holds any (-1 if none could be opened, or
        /// for an app's key).
        let pin: Int32
    }

    /// The program whose request this thread answers, with a descriptor pinning its namespace if
    /// it is not charged with anything yet (closed unless the program becomes an owner).
    final class Claimant: Sendable {
        let key: UInt64
        private let pin: Mutex<Int32>

        init(key: UInt64, pin: Int32) {
            self.key = key
            self.pin = Mutex(pin)
        }

        /// The pin, now the caller's to close.
        func takePin() -> Int32 {
            pin.withLock {
                let fd = $0; $0 = -1; return fd
            }
        }

        deinit { let fd = takePin(); if fd >= 0 { close(fd) } }
    }

    /// Room for one node, taken before an item is made on disk (a create, a mkdir…): counted in
    /// the table and in its owner's share until the node takes it or it is released.
    final class Reservation: Sendable {
        let owner: UInt64
        private let pending = Mutex(true)

        init(owner: UInt64) { self.owner = owner }

        /// Whether it was still pending (it no longer is).
        func take() -> Bool {
            pending.withLock {
                let was = $0; $0 = false; return was
            }
        }
    }

    /// The program asking, when the table is shared.
    func claimant() -> Claimant? {
        guard sharedByRequester else { return nil }
        if case .app(let app) = apps.requesting { return Claimant(key: app.owner, pin: -1) }
        let namespace = Requester.namespace
        if state.withLock({ $0.serials[namespace] != nil }) { return Claimant(key: namespace, pin: -1) }
        return Claimant(key: namespace, pin: Requester.pin(namespace))
    }

    /// Charges one node to `claimant` if the table and its share have room: its owner's serial
    /// (0 for a table not shared), or `nil`.
    func charge(_ claimant: Claimant?, in state: inout State) -> UInt64? {
        guard state.nodes.count + state.reserved < capacity else { return nil }
        guard sharedByRequester, let claimant else { return 0 }
        let serial = state.serials[claimant.key]
        let mine = serial.flatMap { state.owners[$0]?.held } ?? 0
        let significant = max(1, capacity / 16)
        let others = state.owners.values.count { $0.key != claimant.key && $0.held >= significant }
        guard mine < capacity * 2 / (others + 3) else { return nil }
        if let serial {
            state.owners[serial]?.held += 1
            return serial
        }
        let made = state.nextSerial
        state.nextSerial += 1
        var pin = claimant.takePin()
        // Its owner was known when asked and has gone since: pinned now (rarely, under the lock).
        if pin < 0, claimant.key & ServedApps.appOwnerBit == 0 { pin = Requester.pin(claimant.key) }
        state.owners[made] = Owner(key: claimant.key, held: 1, pin: pin)
        state.serials[claimant.key] = made
        return made
    }

    /// One node less for `serial`; an owner holding none is forgotten (and its pin closed).
    static func uncharge(_ serial: UInt64, in state: inout State) {
        guard serial != 0, var owner = state.owners[serial] else { return }
        owner.held -= 1
        if owner.held > 0 {
            state.owners[serial] = owner
            return
        }
        state.owners[serial] = nil
        if state.serials[owner.key] == serial { state.serials[owner.key] = nil }
        if owner.pin >= 0 { close(owner.pin) }
    }

    /// Reserves room for a node about to be made, in the requester's share (`ENFILE`: none).
    /// Release it with ``release(_:)`` whether or not a node took it.
    func reserve() throws(Errno) -> Reservation {
        let claimant = claimant()
        let owner = state.withLock { state -> UInt64? in
            guard let owner = charge(claimant, in: &state) else {
                askForPassOnRefusal(in: &state)
                return nil
            }
            state.reserved += 1
            return owner
        }
        guard let owner else { throw Errno(rawValue: ENFILE) }
        return Reservation(owner: owner)
    }

    /// Gives back a reservation no node took (nothing, if one did).
    func release(_ reservation: Reservation) {
        state.withLock { state in
            guard reservation.take() else { return }
            state.reserved -= 1
            Self.uncharge(reservation.owner, in: &state)
        }
    }

}
