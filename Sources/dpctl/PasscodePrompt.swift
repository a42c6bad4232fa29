import DataProtection
import Foundation
import Synchronization

/// Asking for the passcode on the terminal, as fscrypt and age do, when a command needs a class
/// that is unavailable and no passcode was given (`--passcode-file`, `$DP_PASSCODE_FILE`).
///
/// The question goes to the controlling terminal (`/dev/tty`, through `getpass`, without echo),
/// so it works while standard input and output carry data. Without a terminal — a script, a
/// pipe, cron, a test — nothing is asked and the command fails as before (exit 3, with a hint).
/// One question per run: a wrong answer is one failed attempt, as at the lock screen.
enum PasscodePrompt {
    /// Whether a person can be asked: this process has a controlling terminal.
    static var terminalAvailable: Bool {
        let fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        close(fd)
        return true
    }

    /// Unlocks `keybag` with a passcode typed on the terminal when one of `reading` cannot be
    /// opened or one of `creating` cannot be created now, the device has a passcode, and there
    /// is a terminal. Otherwise it does nothing: the command goes on and fails as it would.
    static func unlockIfNeeded(_ keybag: Keybag, reading: some Sequence<ProtectionClass> = [], creating: some Sequence<ProtectionClass> = []) async throws {
        var needed = false
        for cls in reading where !(await keybag.isAvailable(cls)) { needed = true }
        for cls in creating where !(await keybag.canCreate(cls)) { needed = true }
        guard needed else { return }
        try await ask(keybag)
    }

    /// Runs `body`; when it fails because protected data is unavailable, asks for the passcode
    /// (as ``unlockIfNeeded(_:reading:creating:)``) and runs it once more. Only for work that
    /// fails before it changes anything (a check first, an open).
    static func retrying<T>(_ keybag: Keybag, _ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch where ExitStatus(for: error) == .unavailable {
            guard try await ask(keybag) else { throw error }
            return try await body()
        }
    }

    /// Asks and unlocks; false when nobody can be asked (no passcode set, no terminal, asked already).
    @discardableResult
    static func ask(_ keybag: Keybag) async throws -> Bool {
        guard await keybag.lockState != .unlocked, await keybag.status.passcodeSet, terminalAvailable,
              asked.withLock({ let before = $0; $0 = true; return !before }) else { return false }
        guard let typed = getpass("Passcode: ").map({ String(cString: $0) }), !typed.isEmpty else {
            throw CLIError("no passcode given")
        }
        try await keybag.unlock(passcode: typed)
        return true
    }

    private static let asked = Mutex(false)

    /// The classes of the protected files at `path` and below it (links not followed), read
    /// from their headers without any key.
    static func classes(below path: String) -> Set<ProtectionClass> {
        var found = Set<ProtectionClass>()
        var pending = [path]
        while let item = pending.popLast() {
            switch try? ItemInspector.protection(ofItemAt: URL(fileURLWithPath: item)) {
            case .protected(let cls)?: found.insert(cls)
            case .directory?:
                guard let st = POSIXFile.linkStatus(item), st.st_mode & S_IFMT == S_IFDIR else { continue }
                pending += ((try? POSIXFile.directoryEntries(item)) ?? []).map { item + "/" + $0 }
            default: continue
            }
        }
        return found
    }
}
