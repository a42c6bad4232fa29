import DataProtection
import DataProtectionSystem
import Foundation
import Synchronization

/// Asking for the passcode on the terminal, as fscrypt and age do, when a command needs a class
/// that is unavailable and no passcode was given (`--passcode-file`, `$DP_PASSCODE_FILE`).
///
/// The question goes to the controlling terminal (`/dev/tty`, without echo, which comes back
/// even on Ctrl-C), so it works while standard input and output carry data. Without a
/// terminal — a script, a pipe, cron, a test — or with `DP_TERMINAL_PROMPT=0`, nothing is
/// asked and the command fails as before (exit 3, with a hint). One question per run: a wrong
/// answer is one failed attempt, as at the lock screen; an empty one is none.
enum PasscodePrompt {
    /// Whether a question would be asked: a terminal, and `DP_TERMINAL_PROMPT` not 0.
    static var canAsk: Bool { questionsAllowed && terminalAvailable }

    /// `DP_TERMINAL_PROMPT` is not 0.
    private static var questionsAllowed: Bool { ProcessInfo.processInfo.environment[disableVariable] != "0" }

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
    static func unlockIfNeeded(
        _ keybag: Keybag, reading: some Sequence<ProtectionClass> = [], creating: some Sequence<ProtectionClass> = []
    ) async throws {
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
        } catch  where ExitStatus(for: error) == .unavailable {
            guard try await ask(keybag) else { throw error }
            return try await body()
        }
    }

    /// Asks and unlocks; false when nobody can be asked (no passcode set, no terminal,
    /// `DP_TERMINAL_PROMPT=0`, asked already) or nothing was typed.
    @discardableResult
    static func ask(_ keybag: Keybag) async throws -> Bool {
        guard questionsAllowed,
            await keybag.lockState != .unlocked, await keybag.status.passcodeSet, terminalAvailable,
            asked.withLock({
                let before = $0; $0 = true; return !before
            })
        else { return false }
        guard var typed = readHidden(prompt: "Passcode: ") else { return false }
        defer { typed.resetBytes(in: 0..<typed.count) }
        guard !typed.isEmpty, let passcode = String(bytes: typed, encoding: .utf8) else { return false }
        try await unlockSayingSo(keybag, passcode: passcode)
        return true
    }

    /// `DP_TERMINAL_PROMPT=0` turns the question off (as `GIT_TERMINAL_PROMPT=0` does for git):
    /// for a script run from a terminal that must fail rather than wait.
    static let disableVariable = "DP_TERMINAL_PROMPT"

    /// A passcode typed on the terminal (for `unlock`, `tpm enroll` and `tpm remove`, which
    /// always need one); `nil` without a terminal or when nothing was typed.
    static func typedPasscode(prompt: String = "Passcode: ") -> String? {
        guard questionsAllowed else { return nil }
        guard var typed = readHidden(prompt: prompt) else { return nil }
        defer { typed.resetBytes(in: 0..<typed.count) }
        return typed.isEmpty ? nil : String(bytes: typed, encoding: .utf8)
    }

    /// A new passcode or password (`what`), typed twice on the terminal as cryptsetup and
    /// gocryptfs ask for one; `nil` when nobody can be asked (no terminal, `DP_TERMINAL_PROMPT=0`).
    /// An empty answer or two different ones change nothing: an error says which. With a
    /// `minimumLength` (the device's passcode policy), a shorter first answer is refused with the
    /// rule before it is asked again.
    static func typedNewSecret(_ what: String, minimumLength: Int? = nil) throws -> String? {
        guard questionsAllowed else { return nil }
        guard var first = readHidden(prompt: "New \(what): ") else { return nil }
        defer { first.resetBytes(in: 0..<first.count) }
        guard !first.isEmpty else { throw CLIError("no \(what) typed: nothing was changed", status: .usage) }
        if let minimumLength, PasscodePolicy.characterCount(first) < minimumLength {
            throw KeybagError.passcodeTooShort(minimumLength: minimumLength)
        }
        guard var second = readHidden(prompt: "Repeat the new \(what): ") else { return nil }
        defer { second.resetBytes(in: 0..<second.count) }
        guard first == second else {
            throw CLIError("the two \(what)s typed differ: nothing was changed", status: .usage)
        }
        guard let secret = String(bytes: first, encoding: .utf8) else {
            throw CLIError("the \(what) typed is not UTF-8: nothing was changed", status: .usage)
        }
        return secret
    }

    /// The new secret from `file` when one is given, else typed twice; without either, a usage
    /// error naming the option (`nothing was changed`).
    static func newSecret(_ what: String, file: String?, option: String, minimumLength: Int? = nil) throws -> String {
        if let file { return try readPasscode(file) }
        if let typed = try typedNewSecret(what, minimumLength: minimumLength) { return typed }
        throw CLIError(
            "no terminal to ask for the new \(what) on: give \(option) FILE (nothing was changed)", status: .usage)
    }

    /// Reads one line from the terminal with echo off; echo comes back however the read ends,
    /// Ctrl-C and other deadly signals included. `nil` without a terminal.
    private static func readHidden(prompt: String) -> Data? {
        let fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var original = termios()
        guard tcgetattr(fd, &original) == 0 else { return nil }
        var hidden = original
        hidden.c_lflag &= ~tcflag_t(ECHO)
        hidden.c_lflag |= tcflag_t(ECHONL)
        TerminalRestore.save(fd: fd, mode: original)
        let signals = [SIGINT, SIGTERM, SIGHUP, SIGQUIT]
        let previous = signals.map { signal($0, TerminalRestore.handler) }
        defer {
            var mode = original
            _ = tcsetattr(fd, TCSAFLUSH, &mode)
            for (sig, handler) in zip(signals, previous) { signal(sig, handler) }
            TerminalRestore.clear()
        }
        guard tcsetattr(fd, TCSAFLUSH, &hidden) == 0 else { return nil }
        _ = prompt.withCString { Glibc.write(fd, $0, strlen($0)) }
        // Sized once and capped: a growing buffer would leave copies of the secret behind.
        var line = Data(capacity: maximumLength)
        var byte: UInt8 = 0
        while Glibc.read(fd, &byte, 1) == 1, byte != 0x0A {
            if byte != 0x0D, line.count < maximumLength { line.append(byte) }
        }
        return line
    }

    private static let asked = Mutex(false)
    /// The longest answer kept (longer lines are cut, as a terminal's own line buffer does).
    private static let maximumLength = 4096

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

/// The terminal mode to put back when a signal ends the process during the question. Set
/// only while the question is asked; read only by the signal handler.
private enum TerminalRestore {
    nonisolated(unsafe) static var fd: Int32 = -1
    nonisolated(unsafe) static var mode = termios()

    static func save(fd: Int32, mode: termios) {
        self.mode = mode
        self.fd = fd
    }

    static func clear() { fd = -1 }

    /// Puts the mode back (tcsetattr is async-signal-safe), then dies of the signal as it would have.
    static let handler: @convention(c) (Int32) -> Void = { sig in
        if TerminalRestore.fd >= 0 { _ = tcsetattr(TerminalRestore.fd, TCSANOW, &TerminalRestore.mode) }
        signal(sig, SIG_DFL)
        raise(sig)
    }
}
