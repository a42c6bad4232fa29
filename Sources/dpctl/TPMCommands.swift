import ArgumentParser
import DataProtection
import Foundation

struct TPM: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tpm",
        abstract: "Move the device secret into or out of the TPM.",
        discussion: """
            With the device secret sealed by a TPM 2.0, the TPM checks every passcode and counts wrong \
            ones in its dictionary-attack lockout, failed attempts are counted where no copied file \
            can reset them, and a copy of the data root is useless on another machine. The TPM is \
            reached through $\(TPMBinding.tctiEnvironmentVariable) (default device:/dev/tpmrm0, which \
            needs membership of the tss group). `dpctl status` shows the lockout state.
            """,
        subcommands: [TPMEnroll.self, TPMRemove.self])
}

struct TPMEnroll: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "enroll",
        abstract: "Move the device secret into the TPM.",
        usage: "dpctl tpm enroll [--tpm-pcrs <list>] [<options>]",
        discussion: """
            A new secret is sealed by the TPM, every class key is rewrapped under it (no file is \
            rewritten) and device.secret is overwritten and removed. A copy of the data root taken \
            before enrollment still opens with the old secret: enrollment protects what is copied \
            afterwards. Stop keybagd for the root first.
            """)

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Option(help: ArgumentHelp("Bind to these PCRs of the SHA-256 bank (e.g. 7 or 0+7).", valueName: "list"))
    var tpmPcrs: String?

    func validate() throws {
        if let tpmPcrs, TPMPCRSelection(parsing: tpmPcrs) == nil {
            throw ValidationError("--tpm-pcrs takes PCR numbers 0…23 joined by + or , (e.g. 7 or 0+7)")
        }
    }

    func run() async throws {
        let keybag = try await device.openDevice(passcodeFile: nil)
        let passcode = try await passcodeForRewrap(keybag, unlock.passcodeFile)
        try await keybag.enrollTPM(
            passcode: passcode, TPMBinding(pcrs: tpmPcrs.flatMap(TPMPCRSelection.init(parsing:))))
        printOut(await keybag.status.deviceSecret.consequence)
    }
}

struct TPMRemove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "remove",
        abstract: "Move the device secret back into a file.",
        discussion: "The TPM's objects are removed. Stop keybagd for the root first.")

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions

    func run() async throws {
        let keybag = try await device.openDevice(passcodeFile: nil)
        let passcode = try await passcodeForRewrap(keybag, unlock.passcodeFile)
        try await keybag.removeTPM(passcode: passcode)
        printOut(await keybag.status.deviceSecret.consequence)
    }
}

/// The passcode when one is set: from `--passcode-file`, else asked on the terminal.
private func passcodeForRewrap(_ keybag: Keybag, _ file: String?) async throws -> String? {
    guard await keybag.status.passcodeSet else { return nil }
    if let file { return try readPasscode(file) }
    guard let typed = PasscodePrompt.typedPasscode() else {
        throw CLIError("the passcode is needed: give --passcode-file FILE")
    }
    return typed
}
