"""`kvpreflight keygen`: make a signing key pair for release records."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("keygen")
    def keygen(
        out: Path = typer.Option(..., "--out",
            help="Directory for kvpreflight.key (private, mode 0600) and kvpreflight.pub. Existing keys are never overwritten."),
        algorithm: str = typer.Option("ecdsa-p256", "--algorithm", help="ecdsa-p256 (what cosign handles best) or ed25519."),
        encrypt: bool = typer.Option(False, "--encrypt",
            help="Encrypt the private key with the password in $KVPREFLIGHT_SIGN_KEY_PASSWORD."),
    ) -> None:
        """Create a key pair for signing release records (`check --sign-key`) and verifying them (`verify --key`)."""
        from kvpreflight.record import keys

        key, private_path, public_path = keys.keygen(out, algorithm=algorithm, encrypt=encrypt)
        typer.echo(f"private key  {private_path}  (mode 0600; keep it secret; "
                   f"sign with --sign-key {private_path} or ${keys.SIGN_KEY_ENV}={private_path})")
        typer.echo(f"public key   {public_path}  (give this to whoever runs `kvpreflight verify --key`)")
        typer.echo(f"algorithm    {key.public.algorithm}")
        typer.echo(f"keyid        {key.keyid}")
