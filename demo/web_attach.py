"""The demo chat page's attachments: a file input, previews, and what the
server received (the sha256 of every attached image, for tests).

The page reads each picked file as a data: URL, shows it under the composer
(``#attachments img.attachment``, marked ``data-ready`` once decoded, which
is what the profile's ``upload_done`` waits for), and sends the data URLs
with the next message, shown in the conversation with it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

MAX_IMAGES = 8

ATTACH_HTML = """<input id="attach" type="file" accept="image/*" multiple>
<div id="attachments"></div>"""

# Runs before the chat script: `takeAttachments()` is what `go()` sends.
ATTACH_JS = """
const attachInput = document.getElementById('attach');
const attachments = document.getElementById('attachments');
let pendingImages = [];
function readAsDataUrl(file) {
  return new Promise((ok, bad) => {
    const r = new FileReader(); r.onload = () => ok(r.result); r.onerror = bad;
    r.readAsDataURL(file);
  });
}
attachInput.addEventListener('change', async () => {
  for (const file of Array.from(attachInput.files)) {
    const url = await readAsDataUrl(file);
    pendingImages.push(url);
    const img = document.createElement('img');
    img.className = 'attachment'; img.width = 48;
    img.onload = () => { img.dataset.ready = '1'; };
    img.src = url; attachments.appendChild(img);
  }
  attachInput.value = '';
});
function takeAttachments(into) {
  const images = pendingImages; pendingImages = []; attachments.replaceChildren();
  for (const url of images) {
    const img = document.createElement('img');
    img.className = 'attachment sent'; img.width = 48; img.src = url; into.appendChild(img);
  }
  return images;
}
"""


def image_hashes(payload: Any) -> list[str] | None:
    """sha256 of each attached image's bytes; None when `payload` is malformed."""
    if payload is None:
        return []
    if not isinstance(payload, list) or len(payload) > MAX_IMAGES:
        return None
    hashes = []
    for url in payload:
        if not isinstance(url, str) or not url.startswith("data:"):
            return None
        _, _, data = url.partition(",")
        try:
            hashes.append(hashlib.sha256(base64.b64decode(data, validate=True)).hexdigest())
        except (binascii.Error, ValueError):
            return None
    return hashes
