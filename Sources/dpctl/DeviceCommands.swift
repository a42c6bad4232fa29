import ArgumentParser
import DataProtection
import Foundation

struct Init: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Set up a new device in the data root.",
        usage: "dpctl init [<options>]",
        discussion:
            "Writes the device secret, the class keys and the keybag. scrypt parameters are calibrated so one passcode attempt costs at least 80 ms on this machine."
    )

    @OptionGroup var device: DeviceOptions
    @Option(
        help: ArgumentHelp(
            "File holding the passcode (\"-\" for standard input); without it and --no-passcode, it is asked twice on the terminal.",
            valueName: "file"))
    var passcodeFile: String?
    @Flag(help: "No passcode: data protection stays inactive (everything is always available).")
    var noPasscode = false
    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "Seconds between a lock and the discarding of class A keys (0 to \(Int(PasscodePolicy.maximumGracePeriod))).",
            valueName: "seconds"))
    var gracePeriod: Seconds = Seconds(10)
    @Flag(inversion: .prefixedNo, help: "Crypto-erase the device after 10 consecutive wrong passcodes.")
    var eraseAfterTenFailures = false
    @Option(
        help: ArgumentHelp(
            "The passcode policy: passcodes shorter than this are refused (\(PasscodePolicy.minimumLengthRange.lowerBound) to \(PasscodePolicy.minimumLengthRange.upperBound)).",
            valueName: "characters"))
    var minPasscodeLength = PasscodePolicy.defaultMinimumLength
    @Flag(
        inversion: .prefixedNo,
        help: ArgumentHelp(
            "Seal the device secret by the TPM (--no-tpm: keep it in a file, the default).",
            discussion:
                "The TPM is reached through $\(TPMBinding.tctiEnvironmentVariable) (default device:/dev/tpmrm0)."))
    var tpm = false
    @Option(
        help: ArgumentHelp("With --tpm: bind to these PCRs of the SHA-256 bank (e.g. 7 or 0+7).", valueName: "list"))
    var tpmPcrs: String?

    func validate() throws {
        if passcodeFile != nil, noPasscode {
            throw ValidationError("give one of --passcode-file F and --no-passcode, not both")
        }
        if tpmPcrs != nil, !tpm { throw ValidationError("--tpm-pcrs needs --tpm") }
        try validatePasscodeRule(minPasscodeLength)
        if let tpmPcrs, TPMPCRSelection(parsing: tpmPcrs) == nil {
            throw ValidationError("--tpm-pcrs takes PCR numbers 0…23 joined by + or , (e.g. 7 or 0+7)")
        }
    }

    func run() async throws {
        device.bootstrapLogging()
        let root = try device.resolvedRoot
        // A root already set up is said before a passcode is asked for nothing.
        if !noPasscode, passcodeFile == nil, FileManager.default.fileExists(atPath: root + "/keybag") {
            throw KeybagError.alreadyInitialized(root: root)
        }
        let passcode =
            noPasscode
            ? nil
            : try PasscodePrompt.newSecret(
                "passcode", file: passcodeFile, option: "--passcode-file (or --no-passcode)",
                minimumLength: minPasscodeLength)
        let binding = tpm ? TPMBinding(pcrs: tpmPcrs.flatMap(TPMPCRSelection.init(parsing:))) : nil
        let keybag = try await Keybag.create(
            root: root, passcode: passcode, gracePeriod: gracePeriod.value,
            eraseAfterTenFailures: eraseAfterTenFailures, minimumPasscodeLength: minPasscodeLength,
            tpm: binding)
        let status = await keybag.status
        printOut("initialized \(status.root) (keybag \(status.keybagID))")
        printOut(
            status.passcodeSet ? "passcode set; passcode KDF \(status.kdf)" : "no passcode: data protection is inactive"
        )
        printOut("device secret " + status.deviceSecret.consequence)
    }
}

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status", abstract: "Show lock state, passcode, failures and delays.",
        usage: "dpctl status [--json] [--check] [<options>]")

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Flag(help: "Print JSON.")
    var json = false
    @Flag(
        help: ArgumentHelp(
            "Print only the lock state; exit 0 when protected data is available, 3 when it is not (as `systemctl is-active`).",
            discussion:
                "Protected data is available when class A is: unlocked, within the grace period after a lock, or no passcode set."
        ))
    var check = false

    func run() async throws {
        let keybag = try await device.openDevice(passcodeFile: unlock.passcodeFile)
        let s = await keybag.status
        if check {
            printOut(s.lockState.rawValue)
            if !s.available.contains(.complete) { throw ExitCode(ExitStatus.unavailable.rawValue) }
            return
        }
        if json {
            var object: [String: Any] = [
                "root": s.root, "keybag": s.keybagID.uuidString, "state": s.lockState.rawValue,
                "passcodeSet": s.passcodeSet, "protectionActive": s.protectionActive,
                "failedAttempts": s.failedAttempts, "delayRemainingSeconds": s.delayRemaining ?? 0,
                "gracePeriodSeconds": s.gracePeriod, "eraseAfterTenFailures": s.eraseAfterTenFailures,
                "minimumPasscodeLength": s.minimumPasscodeLength,
                "kdf": ["algorithm": "scrypt", "logN": Int(s.kdf.logN), "r": Int(s.kdf.r), "p": Int(s.kdf.p)],
                "available": s.available.map(\.shortName),
                "protectedDataAvailable": s.available.contains(.complete),
            ]
            if let grace = s.graceRemaining { object["graceRemainingSeconds"] = grace }
            object["keybagd"] = keybag.daemonSocket ?? NSNull()
            switch s.deviceSecret {
            case .file: object["deviceSecret"] = ["storage": "file", "consequence": s.deviceSecret.consequence]
            case .tpm(let pcrs):
                object["deviceSecret"] = [
                    "storage": "tpm", "pcrs": pcrs?.indices ?? [], "consequence": s.deviceSecret.consequence,
                ]
            }
            if let l = s.tpmLockout {
                object["tpm"] = [
                    "inLockout": l.inLockout, "lockoutAuthorizationSet": l.lockoutAuthorizationSet,
                    "failedTries": Int(l.failedTries), "maxTries": Int(l.maxTries),
                    "remainingTries": Int(l.remainingTries), "recoveryIntervalSeconds": Int(l.recoveryInterval),
                ]
            }
            if let problem = s.tpmProblem { object["tpmProblem"] = problem }
            let unsupported = TPMBinding.unsupportedReason
            object["tpmSupport"] =
                ["available": unsupported == nil, "reason": unsupported ?? NSNull()] as [String: Any]
            if let rollback = s.lastRollback {
                object["lastKeybagRollback"] = ISO8601DateFormatter().string(from: rollback)
            }
            let data = try JSONSerialization.data(
                withJSONObject: object, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes])
            printOut(String(decoding: data, as: UTF8.self))
            return
        }
        let rows: [[String]] = [
            ["root:", s.root],
            ["keybag:", s.keybagID.uuidString],
            ["state:", s.lockState.rawValue],
            [
                "passcode:",
                s.passcodeSet ? "set" : "not set — data protection is INACTIVE (every class is always available)",
            ],
            ["failed attempts:", "\(s.failedAttempts)"],
            ["next attempt:", s.delayRemaining.map { "in \(Int($0.rounded(.up))) s" } ?? "allowed now"],
            [
                "grace period:",
                "\(s.gracePeriod) s"
                    + (s.graceRemaining.map { "; class A discarded in \(Int($0.rounded(.up))) s" } ?? ""),
            ],
            ["erase after 10:", s.eraseAfterTenFailures ? "on" : "off"],
            ["passcode policy:", "at least \(s.minimumPasscodeLength) characters"],
            ["passcode KDF:", "\(s.kdf)"],
            ["available:", s.available.isEmpty ? "nothing" : s.available.map(\.description).joined(separator: ", ")],
            [
                "keys held by:",
                keybag.daemonSocket.map { "keybagd (\($0))" }
                    ?? "this process only (no keybagd serves this root; each dpctl run starts before first unlock)",
            ],
            ["device secret:", s.deviceSecret.consequence],
        ]
        var extra: [[String]] = []
        if let l = s.tpmLockout {
            extra.append([
                "TPM lockout:",
                l.inLockout
                    ? "IN LOCKOUT: no passcode is accepted until a failure expires (one every \(l.recoveryInterval) s)"
                    : "\(l.failedTries) of \(l.maxTries) failures counted, \(l.remainingTries) left (one forgotten every \(l.recoveryInterval) s)",
            ])
            if !l.lockoutAuthorizationSet {
                extra.append([
                    "",
                    "the TPM's lockout authorization is not set: anyone who can reach the TPM can reset or turn off this limit (tpm2_changeauth -c lockout sets one)",
                ])
            }
        }
        if let problem = s.tpmProblem { extra.append(["TPM:", "unreachable: \(problem)"]) }
        extra.append([
            "TPM support:",
            TPMBinding.unsupportedReason.map { "not available: \($0)" }
                ?? "available (the TPM Software Stack is installed)",
        ])
        if let rollback = s.lastRollback {
            extra.append([
                "rollback:",
                "an older keybag was put back (detected \(ISO8601DateFormatter().string(from: rollback))); the newer count was kept",
            ])
        }
        printOut(table(rows + extra))
    }
}

struct Unlock: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unlock",
        abstract: "Unlock the device for every process (via keybagd).",
        discussion: "The passcode is read from the terminal, or from --passcode-file FILE ('-' for stdin).")

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions

    func run() async throws {
        let keybag = try await device.openDaemonKeybag()
        let passcode: String
        if let passcodeFile = unlock.passcodeFile {
            passcode = try readPasscode(passcodeFile)
        } else {
            guard let typed = PasscodePrompt.typedPasscode() else {
                // Nothing unlocked: protected data stays unavailable, as for any command that
                // needs a passcode and has no terminal to ask it on.
                throw CLIError("no passcode given (on a terminal, or with --passcode-file FILE)", status: .unavailable)
            }
            passcode = typed
        }
        try await keybag.unlock(passcode: passcode)
        printOut("unlocked: every class is available to every process of this root")
    }
}

struct Lock: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lock",
        abstract: "Lock the device for every process (via keybagd).",
        discussion: "Class A keys are discarded when the grace period ends, in the daemon and in every process.")

    @OptionGroup var device: DeviceOptions

    func run() async throws {
        let keybag = try await device.openDaemonKeybag()
        await keybag.lock()
        let grace = await keybag.gracePeriod
        printOut("locked; class A becomes unavailable in \(grace) s")
    }
}

struct Policy: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "policy",
        abstract: "Show or change the passcode and lock policy.",
        usage: "dpctl policy [<options>]",
        discussion:
            "A change needs the device unlocked. The passcode rule applies when a passcode is next set or changed: the current one still unlocks."
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "Seconds between a lock and the discarding of class A keys (0 to \(Int(PasscodePolicy.maximumGracePeriod))).",
            valueName: "seconds"))
    var gracePeriod: Seconds?
    @Flag(
        inversion: .prefixedNo,
        help: "Crypto-erase the device after 10 consecutive wrong passcodes, or not (as on init).")
    var eraseAfterTenFailures: Bool?
    @Option(
        help: ArgumentHelp(
            "Refuse new passcodes shorter than this (\(PasscodePolicy.minimumLengthRange.lowerBound) to \(PasscodePolicy.minimumLengthRange.upperBound); default \(PasscodePolicy.defaultMinimumLength)).",
            valueName: "characters"))
    var minPasscodeLength: Int?

    func validate() throws {
        if let minPasscodeLength { try validatePasscodeRule(minPasscodeLength) }
    }

    func run() async throws {
        let keybag = try await device.openDevice(passcodeFile: unlock.passcodeFile)
        if gracePeriod != nil || eraseAfterTenFailures != nil || minPasscodeLength != nil {
            // A change needs the device unlocked; it is checked before anything is written.
            try await PasscodePrompt.retrying(keybag) {
                if let gracePeriod { try await keybag.setGracePeriod(gracePeriod.value) }
                if let eraseAfterTenFailures { try await keybag.setEraseAfterTenFailures(eraseAfterTenFailures) }
                if let minPasscodeLength { try await keybag.setMinimumPasscodeLength(minPasscodeLength) }
            }
        }
        let s = await keybag.status
        printOut(
            "grace period \(s.gracePeriod) s; erase after 10 failures \(s.eraseAfterTenFailures ? "on" : "off"); "
                + "passcodes of at least \(s.minimumPasscodeLength) characters")
    }
}

struct SetPasscode: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set-passcode",
        abstract: "Set a passcode: data protection becomes active.",
        usage: "dpctl set-passcode [<options>]")

    @OptionGroup var device: DeviceOptions
    @Option(
        help: ArgumentHelp("File holding the new passcode (default: asked twice on the terminal).", valueName: "file"))
    var newPasscodeFile: String?

    func run() async throws {
        let keybag = try await device.openDevice(passcodeFile: nil)
        if await keybag.status.passcodeSet { throw KeybagError.passcodeAlreadySet }
        let minimum = await keybag.status.minimumPasscodeLength
        try await keybag.setPasscode(
            try PasscodePrompt.newSecret(
                "passcode", file: newPasscodeFile, option: "--new-passcode-file",
                minimumLength: minimum))
        printOut("passcode set: class A, B and C keys are now wrapped by it")
    }
}

struct ChangePasscode: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "change-passcode",
        abstract: "Change the passcode (no file is rewritten).",
        usage: "dpctl change-passcode [<options>]",
        discussion:
            "Only the class keys are rewrapped under the new passcode. Without the files, both are asked on the terminal (the new one twice)."
    )

    @OptionGroup var device: DeviceOptions
    @Option(
        help: ArgumentHelp("File holding the current passcode (default: asked on the terminal).", valueName: "file"))
    var passcodeFile: String?
    @Option(
        help: ArgumentHelp("File holding the new passcode (default: asked twice on the terminal).", valueName: "file"))
    var newPasscodeFile: String?

    func run() async throws {
        try requireOneStandardInput(passcodeFile, newPasscodeFile)
        let keybag = try await device.openDevice(passcodeFile: nil)
        guard await keybag.status.passcodeSet else { throw KeybagError.noPasscodeSet }
        let current: String
        if let passcodeFile {
            current = try readPasscode(passcodeFile)
        } else if let typed = PasscodePrompt.typedPasscode(prompt: "Current passcode: ") {
            current = typed
        } else if PasscodePrompt.canAsk {
            throw CLIError("no current passcode typed: nothing was changed", status: .usage)
        } else {
            throw CLIError(
                "no terminal to ask for the current passcode on: give --passcode-file FILE (nothing was changed)",
                status: .usage)
        }
        let minimum = await keybag.status.minimumPasscodeLength
        let new = try PasscodePrompt.newSecret(
            "passcode", file: newPasscodeFile, option: "--new-passcode-file", minimumLength: minimum)
        try await keybag.changePasscode(from: current, to: new)
        printOut("passcode changed")
    }
}

struct RemovePasscode: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "remove-passcode",
        abstract: "Remove the passcode: data protection becomes inactive.")

    @OptionGroup var device: DeviceOptions
    @Option(help: ArgumentHelp("File holding the current passcode.", valueName: "file"))
    var passcodeFile: String

    func run() async throws {
        let keybag = try await device.openDevice(passcodeFile: nil)
        try await keybag.removePasscode(current: try readPasscode(passcodeFile))
        printOut("passcode removed: data protection is inactive")
    }
}

extension KeybagError {
    /// Errors after which the device cannot be opened but can still be erased.
    var preventsOpeningButNotErasing: Bool {
        switch self {
        case .tpm, .corruptKeybag, .newerKeybagFormat, .badDeviceSecret: true
        default: false
        }
    }
}

struct Erase: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "erase",
        abstract: "Crypto-erase the device: every file unrecoverable.",
        discussion:
            "Destroys the keybag and the device secret (and the TPM's objects): every protected file of this root becomes unrecoverable. On a terminal it asks you to type ERASE; without a terminal (a script, a pipe) it refuses unless --yes is given."
    )

    @OptionGroup var device: DeviceOptions
    @Flag(help: "Do not ask for confirmation.")
    var yes = false

    func run() async throws {
        let keybag: Keybag
        do {
            keybag = try await device.openDevice(passcodeFile: nil)
        } catch let error as KeybagError where error.preventsOpeningButNotErasing {
            // A device that no longer opens (its TPM refuses, its keybag is damaged) can still be erased.
            let root = try device.resolvedRoot
            printError("dpctl: \(root) cannot be opened (\(error)); erasing what is there")
            try confirm(root)
            try Keybag.eraseUnopened(root: root)
            printOut("erased \(root): keybag, device secret and TPM objects destroyed")
            return
        }
        try confirm(keybag.root)
        try await keybag.erase()
        printOut("erased \(keybag.root): keybag and device secret destroyed")
    }

    private func confirm(_ root: String) throws {
        guard !yes else { return }
        // No terminal, no implied consent: `dpctl erase </dev/null` in a script erases nothing.
        guard isatty(STDIN_FILENO) == 1 else {
            throw CLIError(
                "not erased: standard input is not a terminal, so nobody can confirm; pass --yes to erase \(root) from a script",
                status: .usage)
        }
        FileHandle.standardError.write(
            Data("Erase \(root)? Every protected file becomes unrecoverable. Type ERASE: ".utf8))
        guard readLine() == "ERASE" else { throw CLIError("not erased") }
    }
}

/// A usage error for a minimum passcode length outside the policy's range.
func validatePasscodeRule(_ length: Int) throws {
    guard PasscodePolicy.minimumLengthRange.contains(length) else {
        let range = PasscodePolicy.minimumLengthRange
        throw ValidationError("--min-passcode-length takes \(range.lowerBound) to \(range.upperBound) characters")
    }
}
