"""Writes book/_extra/favicon.ico, the raster twin of book/favicon.svg (a red rounded square with "lp"), served at
the site's root by `html_extra_path`: the root index.html is a redirect without a <link rel="icon">, and Chromium
then asks for /favicon.ico (a 404 in the browser check's console, on some runs). `python tools/make_favicon.py`."""
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

OUT = Path(__file__).resolve().parents[1] / "book" / "_extra" / "favicon.ico"


def main() -> None:
    img = Image.new("RGBA", (32, 32), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((0, 0, 31, 31), radius=6, fill="#c0392b")
    try:
        font = ImageFont.truetype("DejaVuSansMono-Bold.ttf", 15)
    except OSError:
        font = ImageFont.load_default()
    d.text((16, 16), "lp", fill="#ffffff", font=font, anchor="mm")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    img.save(OUT, sizes=[(32, 32), (16, 16)])


if __name__ == "__main__":
    main()
